"""Debug mode: the checks that read every value, switched on by the user.

By default attnlab.torch checks only what tensors' metadata says (type, dtype,
shape, device, the flags and the scale): nothing reads values and nothing
waits for the device, so a call costs what torch's own costs and
``torch.compile`` sees no host sync. Inside :func:`debug_checks` every public
function and module also checks the values, before any math:

- q, k, v and every module's inputs hold no NaN or Inf (named, with the count
  and the first index);
- a bias holds no NaN or +inf (-inf is a block);
- the scores ``q·kᵀ·scale + bias`` cannot overflow the dtype (which would turn
  a softmax row into NaN): the bound ``D·max|q|·max|k|·|scale|`` of the NumPy core;
- a KV cache's inputs fit its dtype; RoPE positions are >= 0.

Each of these forces a host sync (a GPU waits for it), which is why they are
off by default. Without them a non-finite input propagates as it does in torch.

The switch is process-wide, as ``torch.autograd.set_detect_anomaly`` is, and
:func:`debug_checks` restores the previous setting on exit, exceptions included.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ..errors import AttnlabError
from ..kernel import check_score_range

__all__ = [
    "debug_checks",
    "debug_checks_enabled",
    "check_has_data",
    "check_finite",
    "check_bias_values",
    "check_tensor_score_range",
]

_enabled = False


@contextmanager
def debug_checks(enabled: bool = True) -> Iterator[None]:
    """Check every value inside the block (NaN, Inf, score overflow); see the module docs.

    >>> import attnlab.torch as at
    >>> q = torch.tensor([[float("nan"), 0.0]])
    >>> with at.debug_checks():  # doctest: +ELLIPSIS
    ...     at.scaled_dot_product_attention(q, q, q)
    Traceback (most recent call last):
    ...
    attnlab.errors.AttnlabError: q: expected finite values, got 1 non-finite ...
    >>> debug_checks_enabled()
    False
    """
    global _enabled
    if not isinstance(enabled, bool):
        raise AttnlabError(f"enabled: expected True or False, got {enabled!r}")
    before = _enabled
    _enabled = enabled
    try:
        yield
    finally:
        _enabled = before


def debug_checks_enabled() -> bool:
    """Whether :func:`debug_checks` is in force."""
    return _enabled


def check_has_data(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Refuse tensors on the "meta" device: they have a shape but no values to check."""
    for name, t in named:
        if t.device.type == "meta":
            raise AttnlabError(
                f"{name}: expected a tensor holding values (debug_checks reads them for NaN "
                "and overflow), got one on the meta device, which holds none; leave "
                "debug_checks() for shape inference, or move the tensor to a real device"
            )


def check_finite(named: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Raise if any tensor holds NaN or +-Inf, naming it, the count and the first index."""
    check_has_data(named)
    tensors = [t for _, t in named if t.numel()]
    if not tensors:
        return
    # One sum per tensor and one host sync for all of them: a NaN or Inf anywhere
    # makes its sum non-finite. A finite tensor whose sum overflows is rare and
    # only costs the exact check below.
    with torch.no_grad():  # a check, not part of the model: nothing for autograd to record
        sums = torch.stack([t.detach().sum().float() for t in tensors])
        if bool(torch.isfinite(sums).all()):
            return
    for name, t in named:
        finite = torch.isfinite(t.detach())
        if bool(finite.all()):
            continue
        bad = torch.nonzero(~finite)
        first = tuple(int(i) for i in bad[0])
        kind = "NaN" if bool(torch.isnan(t[first])) else "Inf"
        raise AttnlabError(
            f"{name}: expected finite values, got {len(bad)} non-finite "
            f"(first: {kind} at index {first})"
        )


def check_bias_values(bias: torch.Tensor, name: str = "bias") -> None:
    """A bias may hold -inf (a block) but never NaN or +inf."""
    check_has_data([(name, bias)])
    if bias.numel() and bool((torch.isnan(bias) | torch.isposinf(bias)).any()):
        raise AttnlabError(f"{name}: expected finite values or -inf, got NaN or +inf")


_NUMPY_DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def numpy_dtype(dtype: torch.dtype) -> str:
    """The NumPy dtype whose range bounds ``dtype``'s computation: float64 or float32 (float16
    and bfloat16 are computed in float32)."""
    return _NUMPY_DTYPES.get(dtype, "float32")


def check_tensor_score_range(
    q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float,
    *, cached: torch.Tensor | None = None,
) -> None:
    """The NumPy core's :func:`attnlab.kernel.check_score_range` on tensors: refuse q, k
    whose scaled scores could overflow (to inf, then NaN); one host sync for the maxima.
    ``cached``: keys a KV cache holds besides k. float16 and bfloat16 are bounded as the
    float32 they are computed in."""
    keys = [t for t in (k, cached) if t is not None and t.numel()]
    check_has_data([("q", q), ("k", k)])
    if not q.numel() or not keys:
        return
    with torch.no_grad():
        maxima = [q.detach().abs().amax(), *(t.detach().abs().amax() for t in keys)]
        k_count = len(keys)
        if bias is not None and bias.numel():
            maxima.append(bias.detach().amax())
        values = torch.stack([m.to(torch.float64) for m in maxima]).tolist()
    k_max = max(values[1 : 1 + k_count])
    bias_max = values[1 + k_count] if len(values) > 1 + k_count else 0.0
    dtype = torch.promote_types(q.dtype, k.dtype)
    numpy_dtype = _NUMPY_DTYPES.get(dtype, "float32")
    check_score_range(values[0], k_max, q.shape[-1], scale, numpy_dtype, bias_max=bias_max)
