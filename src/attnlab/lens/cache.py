"""Run a model with its hook points read (:func:`run_with_cache`) or edited
(:func:`run_with_hooks`): TransformerLens's two calls, on attnlab's NumPy and torch
blocks and models alike.

    out, cache = run_with_cache(model, x)                      # every point (not opt-in)
    cache["blocks.0.attn.hook_pattern"]                          # (B, H, T, S)
    out = run_with_hooks(model, x, hooks=[("blocks.0.attn.hook_z", zero_head_2)])
    hook_names(model)                                            # every name, in order

The model is called as ``model(*args, **kwargs)`` when it is callable (NumPy blocks
check their arguments there; torch modules run their hooks and ``forward``), else
``model.forward(*args, **kwargs)`` (:class:`attnlab.models.BertModel`). For a model
that carries a tokenizer, a text or a list of texts may stand for the arguments: it
is tokenised by ``model.tokenize`` into ids and the attention mask.

Names, shapes and the rules of attaching (removal on exit, also after an exception;
nesting; opt-in points) are :mod:`attnlab.hooks`'.

A Hugging Face transformers model gets its hook points on first use
(:mod:`attnlab.lens.hf_points`: ``blocks.{l}.attn.hook_q`` ... ``hook_resid_post``);
its attention points need the model on attnlab's implementation
(:func:`attnlab.hf.register`), and only the layers whose pattern is asked for build it::

    out, cache = run_with_cache(hf_model, **inputs, names=["blocks.1.attn.hook_pattern"])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import AttnlabError
from ..hooks import HookFn, NameFilter, attached, cache_into, select_names
from ..hooks import hook_names as _all_names
from . import hf_points

__all__ = ["HookCache", "hook_names", "run_with_cache", "run_with_hooks"]


class HookCache(dict[str, Any]):
    """Hook name -> the value seen there (a NumPy copy, or a detached torch tensor
    unless gradients were asked for). A missing name is an error listing the names."""

    def __missing__(self, name: str) -> Any:
        shown = ", ".join(list(self)[:6])
        raise AttnlabError(
            f"name: expected a cached hook name ({shown}{', ...' if len(self) > 6 else ''}; "
            f"{len(self)} in all), got {name!r}"
        )


def hook_names(model: Any) -> list[str]:
    """Every hook point of ``model``, in forward order (see :mod:`attnlab.hooks`)."""
    return _all_names(_hookable(model))


def run_with_cache(model: Any, *args: Any, names: NameFilter = None, keep_grad: bool = False,
                   **kwargs: Any) -> tuple[Any, HookCache]:
    """``(output, cache)``: the model's output and the values at the chosen hook points.

    ``names``: None (every point but the opt-in ``hook_result``), a list of names or
    a predicate ``name -> bool``. torch values are detached unless ``keep_grad``.
    """
    if not isinstance(keep_grad, bool):
        raise AttnlabError(f"keep_grad: expected True or False, got {keep_grad!r}")
    model = _hookable(model)
    chosen = select_names(_all_names(model), names)
    if getattr(model, "_attnlab_hook_layers", None) is not None:
        hf_points.check_attention_implementation(model, chosen)
    cache = HookCache()
    keep = cache_into(cache, keep_grad=keep_grad)
    wanted = set(chosen)
    with attached(model, [(wanted.__contains__, keep)] if wanted else []):
        output = _call(model, args, kwargs)
    return output, cache


def run_with_hooks(model: Any, *args: Any,
                   hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]] = (),
                   **kwargs: Any) -> Any:
    """The model's output with ``hooks`` attached: ``[(name or predicate, fn)]``,
    ``fn(value, name)`` returning a replacement (an edit) or None (a read)."""
    if not isinstance(hooks, (list, tuple)):
        raise AttnlabError(f"hooks: expected a list of (name, fn) pairs, got "
                           f"{type(hooks).__name__}")
    model = _hookable(model)
    if getattr(model, "_attnlab_hook_layers", None) is not None:
        all_names = _all_names(model)
        hooked = [n for target, _ in hooks for n in select_names(
            all_names, [target] if isinstance(target, str) else target)]
        hf_points.check_attention_implementation(model, hooked)
    with attached(model, list(hooks)):
        return _call(model, args, kwargs)


def _hookable(model: Any) -> Any:
    """``model``, with hook points installed if it is a Hugging Face model."""
    return hf_points.install(model) if hf_points.is_hf_model(model) else model


def _call(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    texts = args[0] if len(args) == 1 and not kwargs else None
    if isinstance(texts, str) or (isinstance(texts, list) and texts
                                  and all(isinstance(t, str) for t in texts)):
        if getattr(model, "tokenizer", None) is None or not callable(
                getattr(model, "tokenize", None)):
            raise AttnlabError("args: a text stands for the inputs only of a model with a "
                               "tokenizer; pass the forward's arguments instead")
        ids, real, _ = model.tokenize([texts] if isinstance(texts, str) else texts)
        args = (ids, real)
    return model(*args, **kwargs) if callable(model) else model.forward(*args, **kwargs)
