"""Gradient norms per parameter and per head, with flags for vanishing or exploding ones.

Seed 001's debugging checklist asks for "stable gradient norms"; this module
measures them, for a loss the user chooses, on both implementations:

- NumPy: :func:`grad_norms` on an :class:`attnlab.MultiHeadAttention`, from the
  hand-written backward of :mod:`attnlab.nn.backward`. The loss is given by its gradient
  at the output, ``dout = ∂L/∂out`` — an array, or a callable ``out -> ∂L/∂out``.
- PyTorch (:mod:`attnlab.lens.grad_torch`): ``watch_gradients``, a context manager
  that hooks any ``torch.nn.Module`` and removes every hook it added when the block
  ends, even on an exception; or ``torch_grad_norms``, which runs forward, loss and
  backward for you. torch is imported inside those functions only.

Both return a :class:`GradReport`. A norm is the L2 (Frobenius) norm of the
whole gradient of one backward pass. Flags::

    vanishing       norm < vanish_below   (default 1e-7)
    exploding       norm > explode_above  (default 1e3)
    nonfinite       NaN or Inf anywhere in the gradient
    zero_by_design  a key bias below vanish_below: its gradient is exactly 0 in exact
                    arithmetic (see below), which is no sign of trouble

The defaults are absolute and deliberately loose: 1e-7 is ~1e-3 of the smallest
gradient norm a float32 parameter of an initialised layer usually gets (about
1e-4 and up), so the flag means "effectively no signal" (float32 keeps 7 digits:
an Adam or SGD step from it would vanish against the weight); 1e3 is where a
learning rate of 1e-3 moves a weight by order 1 in one step. Both are
keyword arguments everywhere, to adapt to your loss's scale.

Per-head norms (``GradReport.head_norms``) split the projection gradients by
head. In NumPy: the columns of Wq (E, H*D), Wk, Wv and the blocks of bq, bk, bv,
and the rows of Wo (H*Dv, E_out). In torch, see ``grad_torch.watch_gradients`` for which
modules are recognised.

A key bias (NumPy ``bk``, the k third of torch's ``in_proj_bias``, a ``k_proj.bias``)
always gets gradient exactly 0: it adds the same q·bk to every score of a row, and
softmax ignores a constant added to a whole row. It is flagged ``zero_by_design``,
not ``vanishing``, and does not make a report unhealthy.

>>> import numpy as np
>>> from attnlab import MultiHeadAttention
>>> mha = MultiHeadAttention.init(2, 8, seed=0)
>>> x = np.random.default_rng(0).standard_normal((1, 3, 8))
>>> report = grad_norms(mha, x, lambda out: 2 * out)  # L = Σ out², ∂L/∂out = 2 out
>>> report.head_norms["Wq"].shape
(2,)
>>> report.vanishing, report.flags()["bk"]  # the key bias: softmax ignores a row constant
([], 'zero_by_design')
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..nn.backward import mha_backward
from ..nn.multihead import MultiHeadAttention

__all__ = [
    "DEFAULT_EXPLODE_ABOVE",
    "DEFAULT_VANISH_BELOW",
    "GradReport",
    "block_norms",
    "check_thresholds",
    "grad_norms",
    "is_key_bias",
]

DEFAULT_VANISH_BELOW = 1e-7
"""A gradient norm below this is flagged as vanishing."""
DEFAULT_EXPLODE_ABOVE = 1e3
"""A gradient norm above this is flagged as exploding."""


def is_key_bias(name: str) -> bool:
    """Whether ``name`` (a report entry, maybe ``"...[head h]"``) is a key projection's bias."""
    base = name.split("[head ")[0]
    return (base == "bk" or base.endswith((".bk", "in_proj_bias[k]", "k_proj.bias", "key.bias")))


@dataclass(frozen=True)
class GradReport:
    """Gradient norms of one backward pass, and what they flag.

    Attributes:
        norms: parameter name -> L2 norm of its whole gradient.
        head_norms: parameter name (``name[q]`` etc. for a packed q/k/v
            parameter) -> array (heads,) of the norms of each head's block.
        output_norm: norm of ∂L/∂out at the module's output (None if unknown).
        vanish_below, explode_above: the thresholds of the flags.
    """

    norms: dict[str, float]
    head_norms: dict[str, np.ndarray] = field(default_factory=dict)
    output_norm: float | None = None
    vanish_below: float = DEFAULT_VANISH_BELOW
    explode_above: float = DEFAULT_EXPLODE_ABOVE

    def __post_init__(self) -> None:
        check_thresholds(self.vanish_below, self.explode_above)

    def _entries(self) -> Iterator[tuple[str, float]]:
        yield from self.norms.items()
        for name, per_head in self.head_norms.items():
            for head, value in enumerate(per_head):
                yield f"{name}[head {head}]", float(value)

    def flags(self) -> dict[str, str]:
        """Name -> "vanishing", "exploding", "nonfinite" or "zero_by_design" (a key bias,
        whose gradient softmax makes exactly 0), for every flagged norm.

        Heads are named ``"<parameter>[head h]"`` (h counted from 0).
        """
        flagged = {}
        for name, value in self._entries():
            if not math.isfinite(value):
                flagged[name] = "nonfinite"
            elif value < self.vanish_below:
                flagged[name] = "zero_by_design" if is_key_bias(name) else "vanishing"
            elif value > self.explode_above:
                flagged[name] = "exploding"
        return flagged

    @property
    def vanishing(self) -> list[str]:
        return [name for name, kind in self.flags().items() if kind == "vanishing"]

    @property
    def exploding(self) -> list[str]:
        return [name for name, kind in self.flags().items() if kind == "exploding"]

    @property
    def nonfinite(self) -> list[str]:
        return [name for name, kind in self.flags().items() if kind == "nonfinite"]

    @property
    def healthy(self) -> bool:
        """True when nothing is flagged but key biases (zero by design)."""
        return all(kind == "zero_by_design" for kind in self.flags().values())

    def lines(self) -> list[str]:
        """One text line per parameter (and its heads), for a CLI or a log to print."""
        flags = self.flags()
        rows = []
        for name, value in self.norms.items():
            flag = flags.get(name, "")
            if flag == "zero_by_design":
                flag = "0 by design: softmax ignores a constant added to a whole row"
            rows.append(f"{name:<28} {value:10.3e}  {flag}".rstrip())
            for key in (k for k in self.head_norms if k == name or k.startswith(name + "[")):
                heads = " ".join(f"{v:.2e}" for v in self.head_norms[key])
                rows.append(f"  {key + ' by head':<26} {heads}")
        return rows


# --------------------------------------------------------------------------- NumPy


def grad_norms(
    mha: MultiHeadAttention,
    x: Any,
    dout: Any,
    context: Any = None,
    mask: Any = None,
    *,
    key_padding: Any = None,
    bias: Any = None,
    is_causal: bool = False,
    vanish_below: float = DEFAULT_VANISH_BELOW,
    explode_above: float = DEFAULT_EXPLODE_ABOVE,
) -> GradReport:
    """Per-parameter and per-head gradient norms of a NumPy multi-head attention.

    Shapes: x (B, T, E) or (T, E); dout like the output (B, T, E_out), or a
    callable ``out -> ∂L/∂out``; the other arguments as in ``mha(...)`` (mask
    bool, True = may attend).

    Example losses: L = Σ out ⊙ G has ``dout = G``; L = ½‖out − target‖² has
    ``dout = lambda out: out - target``.
    """
    check_thresholds(vanish_below, explode_above)
    if callable(dout):
        out, _ = mha(x, context, mask=mask, key_padding=key_padding, bias=bias,
                     is_causal=is_causal)
        dout = dout(out)
    grads = mha_backward(
        mha, x, dout, context, mask, key_padding=key_padding, bias=bias, is_causal=is_causal
    )
    H, Hkv = mha.num_heads, mha.num_kv_heads or mha.num_heads
    heads_of = {"q": H, "k": Hkv, "v": Hkv}
    head_norms = {}
    for name, grad in grads.params.items():
        if name == "Wo":  # rows are the merged heads (H*Dv, E_out)
            head_norms[name] = block_norms(grad, H, axis=0)
        elif name[1] in heads_of:  # Wq/Wk/Wv columns, bq/bk/bv entries: (…, heads*dim)
            head_norms[name] = block_norms(grad, heads_of[name[1]], axis=-1)
    return GradReport(
        norms={name: float(np.linalg.norm(grad)) for name, grad in grads.params.items()},
        head_norms=head_norms,
        output_norm=float(np.linalg.norm(np.asarray(dout, dtype=np.float64))),
        vanish_below=vanish_below,
        explode_above=explode_above,
    )


def block_norms(grad: np.ndarray, heads: int, axis: int) -> np.ndarray:
    """Norms of ``heads`` equal blocks of ``grad`` along ``axis``: (heads,)."""
    blocks = np.split(np.asarray(grad, dtype=np.float64), heads, axis=axis)
    return np.array([np.linalg.norm(block) for block in blocks])  # (heads,)


def check_thresholds(vanish_below: float, explode_above: float) -> None:
    """Refuse flag thresholds that are not numbers with 0 <= vanish_below < explode_above."""
    for name, value in (("vanish_below", vanish_below), ("explode_above", explode_above)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
            raise AttnlabError(f"{name}: expected a number, got {value!r}")
    if not 0.0 <= vanish_below < explode_above:
        raise AttnlabError(
            "vanish_below, explode_above: expected 0 <= vanish_below < explode_above, "
            f"got {vanish_below!r} and {explode_above!r}"
        )
