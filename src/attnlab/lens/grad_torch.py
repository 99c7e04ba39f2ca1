"""Gradient norms of any ``torch.nn.Module``, per parameter and per head, through hooks.

The torch side of :mod:`attnlab.lens.grad_diagnostics` (same :class:`GradReport`,
same flags and thresholds): :func:`watch_gradients` hooks a module and removes every
hook it added when the block ends, even on an exception; :func:`torch_grad_norms`
runs forward, loss and backward for you. torch is imported inside the functions, so
importing this module does not need it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AttnlabError, missing_extra
from .grad_diagnostics import (
    DEFAULT_EXPLODE_ABOVE,
    DEFAULT_VANISH_BELOW,
    GradReport,
    check_thresholds,
)

if TYPE_CHECKING:
    import torch

__all__ = ["GradientWatch", "torch_grad_norms", "watch_gradients"]

# Child module names (case-insensitive) read as the q / k / v / output projections.
_ROLE_PATTERNS = {
    "q": re.compile(r"^(q|wq|w_q|q_proj|query|to_q|q_lin|linear_q)$", re.IGNORECASE),
    "k": re.compile(r"^(k|wk|w_k|k_proj|key|to_k|k_lin|linear_k)$", re.IGNORECASE),
    "v": re.compile(r"^(v|wv|w_v|v_proj|value|to_v|v_lin|linear_v)$", re.IGNORECASE),
    "o": re.compile(r"^(o|wo|w_o|o_proj|out_proj|to_out|out_lin|linear_out)$", re.IGNORECASE),
    "qkv": re.compile(r"^(qkv|wqkv|w_qkv|qkv_proj|to_qkv|in_proj)$", re.IGNORECASE),
}
# Attributes read as the number of query heads of an attention module.
_HEAD_ATTRS = ("num_heads", "n_heads", "n_head", "num_attention_heads", "heads", "h")


@dataclass(frozen=True)
class _HeadSplit:
    """Block [start, start + length) of a parameter along ``axis``, cut into ``heads`` parts."""

    label: str
    axis: int
    start: int
    length: int
    heads: int


class GradientWatch:
    """What :func:`watch_gradients` records: filled by hooks, read by :meth:`report`.

    Holds the norms of the latest backward pass that reached each parameter, and
    of the gradient at the module's output for its latest call.
    """

    def __init__(
        self,
        parameter_names: list[str],
        splits: dict[str, list[_HeadSplit]],
        vanish_below: float,
        explode_above: float,
    ):
        self._names = parameter_names
        self._splits = splits
        self._vanish_below = vanish_below
        self._explode_above = explode_above
        self.norms: dict[str, float] = {}
        self.head_norms: dict[str, np.ndarray] = {}
        self.output_norm: float | None = None

    def _record_parameter(self, name: str, grad: torch.Tensor) -> None:
        import torch

        g = grad.detach().to(torch.float64)
        self.norms[name] = float(torch.linalg.vector_norm(g))
        for split in self._splits.get(name, []):
            block = g.narrow(split.axis, split.start, split.length)
            parts = block.chunk(split.heads, split.axis)
            self.head_norms[split.label] = np.array(
                [float(torch.linalg.vector_norm(part)) for part in parts]
            )

    def _record_output(self, grad: torch.Tensor) -> None:
        import torch

        self.output_norm = float(torch.linalg.vector_norm(grad.detach().to(torch.float64)))

    def report(self) -> GradReport:
        """The norms so far as a :class:`GradReport`.

        A parameter that requires grad but received none while others did (it was
        not used in the forward) is reported with norm 0.0, hence as vanishing.
        Raises if no backward pass reached any parameter yet.
        """
        if not self.norms:
            raise AttnlabError(
                "watch_gradients: no gradient reached the module's parameters yet; "
                "call loss.backward() (or torch.autograd.grad) inside the with block"
            )
        return GradReport(
            norms={name: self.norms.get(name, 0.0) for name in self._names},
            head_norms=dict(self.head_norms),
            output_norm=self.output_norm,
            vanish_below=self._vanish_below,
            explode_above=self._explode_above,
        )


@contextmanager
def watch_gradients(
    module: torch.nn.Module,
    *,
    num_heads: int | None = None,
    vanish_below: float = DEFAULT_VANISH_BELOW,
    explode_above: float = DEFAULT_EXPLODE_ABOVE,
) -> Iterator[GradientWatch]:
    """Record gradient norms of ``module``'s parameters during the ``with`` block.

    Example (torch; x of shape (B, T, 16))::

        mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
        with watch_gradients(mha) as watch:
            out, _ = mha(x, x, x)
            out.pow(2).sum().backward()
        watch.report().head_norms["in_proj_weight[q]"]  # array of 4 norms, one per head

    Hooks added (and all removed when the block ends, normally or by an
    exception; hooks you registered yourself are left alone):

    - a tensor hook on every parameter that requires grad; it reads the gradient
      of each backward pass (``loss.backward()`` or ``torch.autograd.grad``) and
      changes nothing;
    - a forward hook on ``module`` that puts a tensor hook on its output (the
      first tensor of a tuple output), to record ‖∂L/∂out‖.

    Per-head split. Attention projections are recognised in any submodule that is

    - a ``torch.nn.MultiheadAttention`` (``in_proj_weight`` / ``in_proj_bias``
      reported as ``name[q]``, ``name[k]``, ``name[v]``, or ``q_proj_weight`` etc.;
      ``out_proj.weight`` split by its input columns), with its own ``num_heads``;
    - or a module with ``torch.nn.Linear`` children named like q / k / v / output
      projections (``q_proj``, ``query``, ``wq``, ``to_q``, ..., ``o_proj``,
      ``out_proj``, ``wo``, ...), or packed ``qkv`` (equal thirds), or a
      ``linears`` ModuleList of 4 Linear layers in the order q, k, v, out (the
      Annotated Transformer / seed-001 layout).

    For those, the query heads H come from ``num_heads`` if given, else from the
    module's attribute ``num_heads``, ``n_heads``, ``n_head``,
    ``num_attention_heads``, ``heads`` or ``h``; a module where none is found is
    not split. Assumed layout (torch.nn.Linear's): weight (out, in), heads
    contiguous along ``out`` for q/k/v (head h = rows h*D..(h+1)*D) and along
    ``in`` for the output projection. The head dim is D = q rows / H, and the
    key/value head count is k rows / D (so grouped-query attention is split
    right without being told).
    """
    try:
        import torch
    except ImportError:
        raise missing_extra("torch", "torch", "watch_gradients") from None

    check_thresholds(vanish_below, explode_above)
    if not isinstance(module, torch.nn.Module):
        raise AttnlabError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    splits = _torch_head_splits(module, num_heads)
    watch = GradientWatch([name for name, _ in named], splits, vanish_below, explode_above)
    handles: list[Any] = []

    def parameter_hook(name: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            watch._record_parameter(name, grad)

        return hook

    def forward_hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        first = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            handles.append(first.register_hook(watch._record_output))

    try:
        for name, param in named:
            handles.append(param.register_hook(parameter_hook(name)))
        handles.append(module.register_forward_hook(forward_hook))
        yield watch
    finally:
        for handle in handles:
            handle.remove()


def torch_grad_norms(
    module: torch.nn.Module,
    loss_fn: Callable[[Any], torch.Tensor],
    *inputs: Any,
    num_heads: int | None = None,
    vanish_below: float = DEFAULT_VANISH_BELOW,
    explode_above: float = DEFAULT_EXPLODE_ABOVE,
    **kwargs: Any,
) -> GradReport:
    """Run ``loss_fn(module(*inputs, **kwargs))`` backward and report the gradient norms.

    Uses ``torch.autograd.grad``, so the parameters' ``.grad`` are left as they
    were. ``loss_fn`` receives the module's output as returned (for
    ``nn.MultiheadAttention`` the tuple ``(out, weights)``) and returns a scalar.
    See :func:`watch_gradients` for the per-head split and ``num_heads``.
    """
    import torch

    with watch_gradients(
        module, num_heads=num_heads, vanish_below=vanish_below, explode_above=explode_above
    ) as watch:
        loss = loss_fn(module(*inputs, **kwargs))
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise AttnlabError(
                f"loss_fn: expected a scalar tensor, got {type(loss).__name__} "
                f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}".rstrip()
            )
        params = [p for p in module.parameters() if p.requires_grad]
        torch.autograd.grad(loss, params, allow_unused=True)
    return watch.report()


def _torch_head_splits(module: Any, num_heads: int | None) -> dict[str, list[_HeadSplit]]:
    """Parameter name -> the head blocks to report, following watch_gradients' rules."""
    import torch

    splits: dict[str, list[_HeadSplit]] = {}

    def add(name: str, label: str, axis: int, start: int, length: int, heads: int) -> None:
        if length % heads:
            raise AttnlabError(
                f"{label}: expected its {length} {'rows' if axis == 0 else 'columns'} to split "
                f"into {heads} equal heads"
            )
        splits.setdefault(name, []).append(_HeadSplit(label, axis, start, length, heads))

    for path, sub in module.named_modules():
        prefix = f"{path}." if path else ""
        if isinstance(sub, torch.nn.MultiheadAttention):
            H, E = sub.num_heads, sub.embed_dim
            packed = [("in_proj_weight", sub.in_proj_weight), ("in_proj_bias", sub.in_proj_bias)]
            for pname, param in packed:
                if param is not None:
                    for i, role in enumerate("qkv"):
                        add(prefix + pname, f"{prefix}{pname}[{role}]", 0, i * E, E, H)
            for role in "qkv":
                separate = getattr(sub, f"{role}_proj_weight", None)
                if separate is not None:
                    name = f"{prefix}{role}_proj_weight"
                    add(name, name, 0, 0, separate.shape[0], H)
            name = prefix + "out_proj.weight"
            add(name, name, 1, 0, sub.out_proj.weight.shape[1], H)
            continue
        roles = _linear_roles(sub, torch)
        if not roles or not ({"q", "qkv"} & roles.keys()):
            continue
        H = num_heads if num_heads is not None else _head_attr(sub)
        if H is None:
            continue
        if "qkv" in roles:
            child_name, linear = roles["qkv"]
            width = linear.weight.shape[0] // 3
            q_rows, k_rows = width, width
        else:
            q_rows = roles["q"][1].weight.shape[0]
            k_rows = roles["k"][1].weight.shape[0] if "k" in roles else q_rows
        if q_rows % H:
            raise AttnlabError(
                f"num_heads: {H} heads do not divide the {q_rows} query rows of module "
                f"{path or '<root>'!r}"
            )
        D = q_rows // H
        Hkv = k_rows // D
        if k_rows % D or Hkv == 0 or H % Hkv:
            raise AttnlabError(
                f"module {path or '<root>'!r}: key projection has {k_rows} rows, expected a "
                f"multiple of the head dim D = {D} dividing H = {H}"
            )
        for role, (child_name, linear) in roles.items():
            child = f"{prefix}{child_name}."
            for pname in ("weight", "bias"):
                if getattr(linear, pname, None) is None:
                    continue
                name = child + pname
                if role == "qkv":
                    for i, part in enumerate("qkv"):
                        add(name, f"{name}[{part}]", 0, i * width, width, H)
                elif role == "o":
                    if pname == "weight":  # the bias of the output is not per head
                        add(name, name, 1, 0, linear.weight.shape[1], H)
                else:
                    heads = H if role == "q" else Hkv
                    add(name, name, 0, 0, linear.weight.shape[0], heads)
    return splits


def _linear_roles(sub: Any, torch: Any) -> dict[str, tuple[str, Any]]:
    """Role ("q", "k", "v", "o", "qkv") -> (child name, Linear) for ``sub``'s direct children."""
    roles: dict[str, tuple[str, Any]] = {}
    for child_name, child in sub.named_children():
        if child_name == "linears" and isinstance(child, torch.nn.ModuleList):
            layers = list(child)
            if len(layers) == 4 and all(isinstance(m, torch.nn.Linear) for m in layers):
                for i, role in enumerate(("q", "k", "v", "o")):
                    roles[role] = (f"linears.{i}", layers[i])
            continue
        if not isinstance(child, torch.nn.Linear):
            continue
        for role, pattern in _ROLE_PATTERNS.items():
            if pattern.match(child_name):
                roles[role] = (child_name, child)
    return roles


def _head_attr(sub: Any) -> int | None:
    for attr in _HEAD_ATTRS:
        value = getattr(sub, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
