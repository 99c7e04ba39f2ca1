"""Scaled dot-product attention in PyTorch.

Behaves identically to :func:`attnlab.scaled_dot_product_attention` (the NumPy
core): same shapes, same mask convention, same causal alignment, same rule for
rows with nothing to attend to. Tested against it to float64 precision.

    Attention(Q, K, V) = softmax(Q Kᵀ · scale + bias, masked) V,   scale = 1/√D

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim. ``...`` is any number of leading batch dims.

Mask convention (the only one in attnlab): ``mask`` is a bool tensor and
**True = may attend** (the same as ``torch.nn.functional.scaled_dot_product_attention``,
and the opposite of ``torch.nn.MultiheadAttention``'s ``attn_mask``, where True
blocks). Additive values go through ``bias``. Seed 000's ``mask * -1e9``
(1 = blocked) is ``m == 0``; seed 001's ``masked_fill(mask == 0, -1e9)`` is ``m == 1``.

What is checked: by default the metadata (types, dtypes, shapes, devices,
flags, the scale), which costs microseconds and never waits for the device;
under :func:`attnlab.torch.debug_checks` also the values (NaN, Inf, a bias's
NaN or +inf, score overflow). The math is :func:`attnlab.torch.kernel.attend`.
"""

from __future__ import annotations

from typing import Any, Literal, overload

import torch

from ..attention import check_axis
from ..checks import check_broadcastable, check_flag
from ..errors import AttnlabError, ShapeError
from ..shapes import check_attention_shapes
from . import debug
from .checks import (
    as_bool_tensor,
    as_float_tensor,
    check_probability,
    check_same_device,
    check_sinks_tensor,
)
from .kernel import AttentionInputs, attend, check_inputs, fast_fused, stable_softmax

__all__ = ["scaled_dot_product_attention", "softmax"]


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:  # (...) -> (...)
    """Softmax along ``dim`` with attnlab's rule: -inf = excluded, an all -inf slice gives zeros.

    Behaves identically to :func:`attnlab.softmax` (where torch.softmax gives NaN
    for an all -inf slice). Integers are computed in float64. NaN and +inf are
    refused under :func:`attnlab.torch.debug_checks` (and propagate otherwise).

    >>> softmax(torch.tensor([0.0, float("-inf")])).tolist()
    [1.0, 0.0]
    >>> softmax(torch.full((2,), float("-inf"))).tolist()
    [0.0, 0.0]
    """
    arr = as_float_tensor(x, "x")
    if arr.ndim == 0:
        raise ShapeError("x: expected at least 1 dimension, got a scalar")
    dim = check_axis(dim, arr.ndim, "dim")
    if debug.debug_checks_enabled():
        debug.check_has_data([("x", arr)])
        if bool((torch.isnan(arr) | torch.isposinf(arr)).any()):
            raise AttnlabError("x: expected finite values or -inf, got NaN or +inf")
    return stable_softmax(arr, dim)


@overload
def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = ..., *,
    bias: torch.Tensor | None = ..., is_causal: bool = ..., dropout_p: float = ...,
    scale: float | None = ..., return_weights: Literal[False] = ...,
    return_lse: Literal[False] = ..., window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    dropout_mask: torch.Tensor | None = ..., sinks: torch.Tensor | None = ...,
    backend: str = ...,
) -> torch.Tensor: ...
@overload
def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = ..., *,
    bias: torch.Tensor | None = ..., is_causal: bool = ..., dropout_p: float = ...,
    scale: float | None = ..., return_weights: Literal[True],
    return_lse: Literal[False] = ..., window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    dropout_mask: torch.Tensor | None = ..., sinks: torch.Tensor | None = ...,
    backend: str = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...
@overload
def scaled_dot_product_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = ..., *,
    bias: torch.Tensor | None = ..., is_causal: bool = ..., dropout_p: float = ...,
    scale: float | None = ..., return_weights: bool = ...,
    return_lse: Literal[True], window: Any = ..., causal_alignment: str = ...,
    softcap: float | None = ..., enable_gqa: bool = ..., alibi_slopes: Any = ...,
    dropout_mask: torch.Tensor | None = ..., sinks: torch.Tensor | None = ...,
    backend: str = ...,
) -> tuple[torch.Tensor, ...]: ...
def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    return_weights: bool = False,
    return_lse: bool = False,
    window: Any = None,
    causal_alignment: str = "bottom_right",
    softcap: float | None = None,
    enable_gqa: bool = False,
    alibi_slopes: Any = None,
    dropout_mask: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    backend: str = "torch",
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Scaled dot-product attention; behaves identically to
    :func:`attnlab.scaled_dot_product_attention`.

    Shapes:
        q    (..., T, D)      queries (..., H, T, D) with ``enable_gqa``
        k    (..., S, D)      keys    (..., Hkv, S, D) with ``enable_gqa``, H % Hkv == 0
        v    (..., S, Dv)     values
        mask bool, broadcastable to (..., T, S); True = may attend
        bias float, broadcastable to (..., T, S); added to the scaled scores (-inf allowed)
        alibi_slopes  (H,) or (B, H) tensor or array: adds -slope·|i' - j|
        dropout_mask  bool, broadcastable to (..., T, S); True = kept (else torch's RNG)
        sinks (H,): attention sinks, one logit per head of q (..., H, T, D), learnable
        ->   out (..., T, Dv), then weights (..., T, S) if ``return_weights``, then
             lse (..., T) if ``return_lse``

    Leading dims of q, k and v broadcast against each other.

    Efficient implementation equivalent to the following (the plain path, which
    runs when ``return_weights``, ``return_lse``, ``softcap`` or ``dropout_mask`` is set)::

        scores  = q @ k.transpose(-1, -2)              # (..., T, S)
        scaled  = scores * scale                       # scale = 1/√D by default
        scaled  = softcap * tanh(scaled / softcap)     # if softcap
        scaled  = scaled + bias + alibi                # alibi = -slope·|i' - j|
        allowed = mask & causal & window               # by position, see below
        weights = softmax(scaled.masked_fill(~allowed, -inf))   # all -inf row -> 0
        # with sinks: softmax (and lse) over cat([scaled, sink_h]), the sink column dropped
        lse     = logsumexp(scaled where allowed)      # (..., T), -inf for an empty row
        weights = dropout(weights, dropout_p)          # or weights * dropout_mask / (1 - p)
        out     = weights @ v                          # (..., T, Dv)

    Positions: query i sits at i' = S - T + i (``causal_alignment="bottom_right"``,
    the default) or i' = i (``"top_left"``, torch's own ``is_causal``); key j at
    j. ``is_causal`` allows j ≤ i'; ``window=(left, right)`` (FlashAttention's
    ``window_size``, -1 = unbounded) allows i' - left ≤ j ≤ i' + right; an int
    W keeps attnlab's meaning (see :func:`attnlab.masks.window_mask`).

    Without those the call goes to torch's fused
    ``F.scaled_dot_product_attention`` (see :mod:`attnlab.torch.kernel`).

    ``dropout_p`` is applied whenever it is > 0 (as in torch's function; modules
    pass 0 in eval mode). The returned weights are the ones multiplied with v,
    after dropout; the lse is before dropout.

    A row with no key to attend to gets weights 0, output 0 and lse -inf.

    Checks: the metadata always (types, dtypes, shapes, devices, flags, scale);
    NaN/Inf in q, k, v, NaN/+inf in bias and score overflow only under
    :func:`attnlab.torch.debug_checks`, since reading values waits for the device.

    Dtypes: inputs are promoted to a common float dtype; integers compute in
    float64; float16 and bfloat16 go to the fused kernel as they are and are
    computed in float32 on the plain path, returned in their own dtype (lse in
    the computation's dtype).

    ``backend="triton"`` runs :func:`attnlab.triton.flash_attention` instead
    (CUDA tensors (B, H, T, D) / (B, Hkv, S, D); ``mask`` a key padding
    broadcastable to (B, 1, 1, S); no bias, dropout or weights): see
    :mod:`attnlab.triton.dispatch`.

    >>> q = k = v = torch.eye(2, dtype=torch.float64)
    >>> scaled_dot_product_attention(q, k, v, is_causal=True).round(decimals=3)
    tensor([[1.0000, 0.0000],
            [0.3300, 0.6700]], dtype=torch.float64)
    """
    if backend != "torch":  # attnlab.triton is optional: imported only when asked for
        if backend != "triton":
            raise AttnlabError(f"backend: expected 'torch' or 'triton', got {backend!r}")
        for name, value, default in (
                ("return_lse", return_lse, False), ("window", window, None),
                ("causal_alignment", causal_alignment, "bottom_right"),
                ("softcap", softcap, None), ("alibi_slopes", alibi_slopes, None),
                ("dropout_mask", dropout_mask, None), ("sinks", sinks, None)):
            if value is not default and value != default:
                raise AttnlabError(
                    f"{name}: backend='triton' computes attention without it; got {value!r} "
                    f"(use backend='torch' for {name})")
        if not check_flag(enable_gqa, "enable_gqa"):  # the torch backend's rule: H = Hkv
            check_attention_shapes(*(tuple(getattr(t, "shape", ())) for t in (q, k, v)))
        from ..triton.dispatch import sdpa_with_backend

        return sdpa_with_backend(q, k, v, mask, bias=bias, is_causal=is_causal,
                                 dropout_p=dropout_p, scale=scale,
                                 return_weights=return_weights, backend=backend)
    if (bias is None and dropout_p == 0.0 and scale is None and return_weights is False
            and return_lse is False and window is None and causal_alignment == "bottom_right"
            and softcap is None and enable_gqa is False and alibi_slopes is None
            and dropout_mask is None and sinks is None and not debug.debug_checks_enabled()):
        out = fast_fused(q, k, v, mask, is_causal)  # None: not the plain common case
        if out is not None:
            return out
    return_weights = check_flag(return_weights, "return_weights")
    return_lse = check_flag(return_lse, "return_lse")
    inputs = check_inputs(q, k, v, mask, bias=bias, is_causal=is_causal, scale=scale,
                          return_weights=return_weights or return_lse, window=window,
                          causal_alignment=causal_alignment, softcap=softcap,
                          enable_gqa=enable_gqa, alibi_slopes=alibi_slopes)
    p = check_probability(dropout_p, "dropout_p")
    keep = _check_dropout_mask(dropout_mask, p, inputs)
    sink_logits = check_sinks(sinks, inputs)
    if debug.debug_checks_enabled():
        check_values(inputs)
    return attend(
        inputs.q, inputs.k, inputs.v, inputs.allowed, inputs.bias, inputs.scale,
        is_causal=inputs.is_causal, dropout_p=p, return_weights=return_weights,
        softcap=inputs.softcap, dropout_mask=keep, return_lse=return_lse, sinks=sink_logits,
    )


def check_sinks(sinks: Any, inputs: AttentionInputs) -> torch.Tensor | None:
    """Attention sinks (H,): one logit per head of q (..., H, T, D), on q's device
    (:func:`attnlab.torch.checks.check_sinks_tensor`). Kept differentiable."""
    return check_sinks_tensor(sinks, inputs.shapes.batch, inputs.q)


def _check_dropout_mask(
    dropout_mask: Any, p: float, inputs: AttentionInputs
) -> torch.Tensor | None:
    """The keep-mask (bool, True = kept, broadcastable to (..., T, S)), or None."""
    if dropout_mask is None:
        return None
    keep = as_bool_tensor(dropout_mask, "dropout_mask")
    shapes = inputs.shapes
    check_broadcastable(keep.shape, (*shapes.batch, shapes.T, shapes.S), "dropout_mask",
                        "(..., T, S)")
    check_same_device(inputs.q, "q", keep, "dropout_mask")
    if p == 0.0:
        raise AttnlabError(
            "dropout_p: expected the probability the dropout_mask was drawn with (> 0), got 0.0"
        )
    return keep


def check_values(inputs: AttentionInputs) -> None:
    """The debug-mode checks of attention inputs: a bias without NaN or +inf, finite q, k, v,
    and scores that cannot overflow."""
    if inputs.bias is not None:
        debug.check_bias_values(inputs.bias)
    debug.check_finite([("q", inputs.q), ("k", inputs.k), ("v", inputs.v)])
    debug.check_tensor_score_range(inputs.q, inputs.k, inputs.bias, inputs.scale)
