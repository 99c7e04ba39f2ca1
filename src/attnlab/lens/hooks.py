"""The lens's two sites on a BERT-like model — each head's output and the residual stream
after each block — as the model's own hook points (:mod:`attnlab.hooks`), for the NumPy
and the torch models alike.

:func:`hooked` is a context manager over :func:`attnlab.hooks.attached`:

``heads``     ``hook(l, heads) -> heads | None`` at ``blocks.{l}.attn.hook_z``, heads
              (B, H, T, Dv): every head's output ``weights·V`` before ``Wo``.
``residual``  ``hook(l, x) -> x | None`` at ``blocks.{l}.hook_resid_post``, x (B, T, E):
              the block's output, the residual stream that the next block reads.

The lens functions are written in NumPy: on a torch model the hook receives the value as
a NumPy array and its replacement goes back as a tensor of the model's dtype and device.
No forward is re-implemented here; hooks are removed on exit, also after an exception,
and contexts nest (an inner one's hooks run after the outer one's).

A model qualifies if it has hook points ``blocks.{l}.attn.hook_z`` and
``blocks.{l}.hook_resid_post`` (:class:`attnlab.models.BertModel`,
:class:`attnlab.torch.models.BertModel`) and a ``forward(input_ids, attention_mask)``.

Dimension legend: B batch, L layers, H heads, T tokens, Dv value head dim, E model width.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..hooks import HookFn, attached, hook_tree

__all__ = ["HeadHook", "LensShape", "ResidualHook", "check_model", "forward", "hooked",
           "is_torch_model", "to_numpy"]

HeadHook = Callable[[int, np.ndarray], "np.ndarray | None"]
ResidualHook = Callable[[int, np.ndarray], "np.ndarray | None"]


@dataclass(frozen=True)
class LensShape:
    """What the lens needs to know of a model: L layers, H heads, Dv value head dim."""

    layers: int
    heads: int
    value_head_dim: int


def check_model(model: Any) -> LensShape:
    """The layers, heads and value head dim of ``model``, or AttnlabError saying what is
    missing (hook points ``blocks.{l}.attn.hook_z`` on every layer)."""
    attention = {}
    try:
        for prefix, module, _ in hook_tree(model):
            parts = prefix.split(".")
            if len(parts) == 4 and parts[0] == "blocks" and parts[2] == "attn":
                attention[int(parts[1])] = module
    except AttnlabError:
        attention = {}
    if not attention or sorted(attention) != list(range(len(attention))):
        raise AttnlabError(f"model: expected a model with hook points blocks.{{l}}.attn.hook_z "
                           f"(e.g. attnlab.models.BertModel or attnlab.torch.models.BertModel), "
                           f"got {type(model).__name__}")
    first = attention[0]
    return LensShape(len(attention), int(first.num_heads), int(first.value_head_dim))


def is_torch_model(model: Any) -> bool:
    """Whether ``model`` is a ``torch.nn.Module`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def to_numpy(value: Any) -> np.ndarray:
    """An array or tensor as a NumPy array (a tensor detached, on the CPU)."""
    if hasattr(value, "detach"):
        return np.asarray(value.detach().cpu().numpy())
    return np.asarray(value)


def forward(model: Any, ids: np.ndarray, real: np.ndarray) -> np.ndarray:
    """The model's hidden states (B, T, E) as NumPy, for ids and real (B, T) as NumPy;
    a torch model runs without gradients on its own device."""
    if not is_torch_model(model):
        return np.asarray(model.forward(ids, real))
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        hidden = model(torch.as_tensor(ids, device=device), torch.as_tensor(real, device=device))
    return to_numpy(hidden)


def _adapt(fn: Callable[[int, np.ndarray], Any]) -> HookFn:
    def hook(value: Any, name: str) -> Any:
        layer = int(name.split(".")[1])  # blocks.{l}....
        if not hasattr(value, "detach"):
            return fn(layer, value)
        replaced = fn(layer, to_numpy(value))
        return None if replaced is None else value.new_tensor(np.asarray(replaced))

    return hook


@contextmanager
def hooked(
    model: Any, *, heads: HeadHook | None = None, residual: ResidualHook | None = None,
) -> Iterator[Any]:
    """Run ``model`` with hooks on every layer's head outputs and residual stream.

    ``heads(l, heads (B, H, T, Dv))`` and ``residual(l, x (B, T, E))`` are called
    for every layer ``l``; each may return a replacement (same shape) or None.
    Yields the model; on exit its hooks are gone, even after an exception.
    ``lens.ablate`` and ``lens.patch`` are written on it.
    """
    check_model(model)
    for name, hook in (("heads", heads), ("residual", residual)):
        if hook is not None and not callable(hook):
            raise AttnlabError(f"{name}: expected a function (layer, array) -> array or None, "
                               f"got {type(hook).__name__}")
    hooks: list[tuple[Any, HookFn]] = []
    if heads is not None:
        hooks.append((lambda n: n.startswith("blocks.") and n.endswith(".attn.hook_z"),
                      _adapt(heads)))
    if residual is not None:
        hooks.append((lambda n: n.startswith("blocks.") and n.endswith(".hook_resid_post")
                      and n.count(".") == 2, _adapt(residual)))
    with attached(model, hooks):
        yield model
