"""Flash attention on a GPU in Triton: forward and backward, with autograd.

The same algorithm as attnlab's NumPy :func:`attnlab.fast.flash.flash_attention`
(tiles, an online softmax, a stored log-sum-exp, weights rebuilt in the
backward), written as the Triton kernels of :mod:`attnlab.triton.kernels`,
which FlashAttention-2 and Triton's fused-attention tutorial describe.

Dimension legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0;
grouped-query attention when Hkv < H), T query length, S key length, D head dim.

Mask convention (the only one in attnlab): ``key_padding`` is bool (B, S) and
**True = a real token** (may be attended to). ``is_causal`` is bottom-right
aligned: query i sits at absolute position S − T + i. A query with nothing to
attend to gets output 0 (never NaN) and lse -inf.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Literal, overload

import torch
import triton

from ..checks import check_flag, check_scale, shape_str
from ..errors import AttnlabError, ShapeError
from ..shapes import check_key_padding_shape
from ..torch.checks import as_float_tensor, check_same_device
from . import kernels

__all__ = ["HEAD_DIMS", "flash_attention", "flash_attention_backward", "interpreting"]

#: The head dims the kernels are built for (a tile's feature axis is one power of two).
HEAD_DIMS = (16, 32, 64, 128)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.0 / math.log(2.0)  # scores are made in base 2: s · log2(e)
_LN2 = math.log(2.0)  # lse2 · ln 2 = lse in natural units


def interpreting() -> bool:
    """Whether the kernels were built for Triton's interpreter (``TRITON_INTERPRET=1`` was set
    before :mod:`attnlab.triton` was first imported): they then run on the CPU, in NumPy."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernels.flash_forward_kernel, InterpretedFunction)


# ----------------------------------------------------------------- tile sizes
# The interpreter runs one program after another in NumPy: one small tile size keeps
# several tiles (and a ragged one) per row in the tests' T, S <= 256. On a GPU the
# autotuner picks among a few configurations per (D, causal, T, S), the ones Triton's
# tutorial uses on Ampere/Hopper, the first time each is seen.


def _configs(pairs: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    if interpreting():
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32})]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
        for bm, bn, warps, stages in pairs
    ]


_KEY = ["HEAD_DIM", "IS_CAUSAL", "HAS_PADDING", "PRECISION", "T", "S"]
# Few configurations: each is compiled once per (D, dtype, causal, padding) before the
# first call returns, ~5-15 s apiece on a CPU core for D = 128. Configurations that do
# not fit in shared memory (float32, D = 128) are dropped by the autotuner; the
# smallest of each list fits everywhere.
_forward_kernel = triton.autotune(
    configs=_configs([(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4),
                      (64, 32, 4, 2)]),
    key=_KEY,
)(kernels.flash_forward_kernel)
# dq: long query tiles, short key tiles; dk, dv: the other way round (the tutorial's
# BLOCK_M2 = 128, BLOCK_N2 = 32 and BLOCK_M1 = 32, BLOCK_N1 = 128).
_dq_kernel = triton.autotune(
    configs=_configs([(128, 32, 4, 4), (64, 64, 4, 3), (64, 32, 4, 2)]),
    key=_KEY,
)(kernels.flash_dq_kernel)
_dkdv_kernel = triton.autotune(
    configs=_configs([(32, 128, 4, 4), (64, 64, 4, 3), (32, 64, 4, 2)]),
    key=_KEY,
)(kernels.flash_dkdv_kernel)
_DELTA_BLOCK = 32 if interpreting() else 64  # rows per program of the δ kernel


# ----------------------------------------------------------------- checks


class FlashInputs:
    """Checked inputs: contiguous tensors of one supported dtype on one device."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 padding: torch.Tensor | None, is_causal: bool, scale: float) -> None:
        self.q, self.k, self.v, self.padding = q, k, v, padding  # padding (B, S) uint8
        self.is_causal, self.scale = is_causal, scale
        self.B, self.H, self.T, self.D = q.shape
        self.Hkv, self.S = k.shape[1], k.shape[2]


def check_flash_inputs(
    q: Any, k: Any, v: Any, is_causal: Any, key_padding: Any, scale: Any,
) -> FlashInputs:
    """attnlab.torch's checks (types, devices, flags, scale, key padding) and the kernels' own
    (4-D layout, H % Hkv, D in HEAD_DIMS, dtype, a device the kernels can run on)."""
    q_t, k_t, v_t = as_float_tensor(q, "q"), as_float_tensor(k, "k"), as_float_tensor(v, "v")
    for name, t, layout in (("q", q_t, "(B, H, T, D)"), ("k", k_t, "(B, Hkv, S, D)"),
                            ("v", v_t, "(B, Hkv, S, D)")):
        if t.ndim != 4:
            raise ShapeError(f"{name}: expected {layout}, got {shape_str(t.shape)}")
    B, H, T, D = q_t.shape
    Bk, Hkv, S, Dk = k_t.shape
    if Bk != B or Dk != D or Hkv == 0 or H % Hkv:
        raise ShapeError(
            f"k: expected (B, Hkv, S, D) with B = {B}, D = {D} and Hkv dividing H = {H} "
            f"(q is {shape_str(q_t.shape)}), got {shape_str(k_t.shape)}"
        )
    if tuple(v_t.shape) != (B, Hkv, S, D):
        raise ShapeError(
            f"v: expected (B, Hkv, S, D) = {shape_str((B, Hkv, S, D))} to match k "
            f"(the kernels need Dv = D), got {shape_str(v_t.shape)}"
        )
    if D not in HEAD_DIMS:
        raise ShapeError(f"q: expected a head dim D in {HEAD_DIMS}, got D = {D}")
    check_same_device(q_t, "q", k_t, "k")
    check_same_device(q_t, "q", v_t, "v")
    dtype = torch.promote_types(torch.promote_types(q_t.dtype, k_t.dtype), v_t.dtype)
    if dtype not in _DTYPES:
        raise AttnlabError(
            f"q, k, v: expected float16, bfloat16 or float32 (the Triton kernels' dtypes), "
            f"got {dtype}; convert with .float() or use attnlab.torch.scaled_dot_product_attention"
        )
    if interpreting():
        if dtype == torch.bfloat16:
            # Measured: Triton's interpreter holds bfloat16 as uint16 and its dot multiplies
            # those integers, so the numbers come out wrong rather than failing.
            raise AttnlabError(
                "q, k, v: bfloat16 cannot run in Triton's interpreter (TRITON_INTERPRET=1), "
                "which computes its dot on bfloat16's raw bits; use float16 or float32 on the "
                "CPU and bfloat16 on a GPU"
            )
    elif q_t.device.type != "cuda":
        raise AttnlabError(
            f"q: expected a CUDA tensor (attnlab.triton's kernels run on a GPU), got a tensor "
            f"on {q_t.device}; on a CPU use attnlab.torch.scaled_dot_product_attention, or set "
            "TRITON_INTERPRET=1 before triton is imported to run the kernels in Triton's "
            "interpreter (slow: for tests)"
        )
    scale_value = check_scale(scale, D)
    causal = check_flag(is_causal, "is_causal")
    padding: torch.Tensor | None = None
    if key_padding is not None:
        is_tensor = isinstance(key_padding, torch.Tensor)
        check_key_padding_shape(
            key_padding.shape if is_tensor else None,
            str(key_padding.dtype) if is_tensor else type(key_padding).__name__,
            is_tensor and key_padding.dtype == torch.bool, (B, S),
        )
        check_same_device(q_t, "q", key_padding, "key_padding")
        padding = key_padding.to(torch.uint8).contiguous()  # (B, S) 1 = real token
    q_t, k_t, v_t = (t.to(dtype).contiguous() for t in (q_t, k_t, v_t))
    return FlashInputs(q_t, k_t, v_t, padding, causal, scale_value)


# ----------------------------------------------------------------- launches


def _launch_args(inputs: FlashInputs) -> dict[str, Any]:
    fp32 = inputs.q.dtype == torch.float32
    return {
        "HEAD_DIM": inputs.D,
        "IS_CAUSAL": inputs.is_causal,
        "HAS_PADDING": inputs.padding is not None,
        # float32 asks for IEEE products: Triton's default on a GPU is TF32 (10-bit mantissa).
        "PRECISION": "ieee" if fp32 else "tf32",
    }


def _on_device(t: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
    """Triton launches on the *current* CUDA device: make it the tensors' (cuda:1 with
    cuda:0 current, as on a multi-GPU node with one process per rank that did not call
    set_device, would otherwise run on the wrong GPU)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _is_empty(inputs: FlashInputs) -> bool:
    return 0 in (inputs.B, inputs.H, inputs.T, inputs.S)


def forward(inputs: FlashInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """out (B, H, T, D) in the inputs' dtype and lse2 (B, H, T) float32, the log-sum-exp in
    base 2 (the backward's statistic). No autograd."""
    B, H, T, D, S = inputs.B, inputs.H, inputs.T, inputs.D, inputs.S
    q = inputs.q
    if _is_empty(inputs):  # S = 0: nothing to attend to -> out 0, lse -inf (flash.py's rule)
        return q.new_zeros((B, H, T, D)), q.new_full((B, H, T), -math.inf, dtype=torch.float32)
    out = torch.empty_like(q)  # (B, H, T, D)
    lse2 = torch.empty((B, H, T), device=q.device, dtype=torch.float32)  # (B, H, T)
    padding = inputs.padding if inputs.padding is not None else q  # unused without padding

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (triton.cdiv(T, meta["BLOCK_M"]), B * H)

    with _on_device(q):
        _forward_kernel[grid](
            q, inputs.k, inputs.v, out, lse2, padding,
            inputs.scale * _LOG2E, T, S, H, H // inputs.Hkv, **_launch_args(inputs),
        )
    return out, lse2


def backward(
    inputs: FlashInputs, out: torch.Tensor, lse2: torch.Tensor, dout: torch.Tensor,
    dlse: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (B, H, T, D), dk, dv (B, Hkv, S, D) from the forward's out and lse2 (base 2).

    ``dlse`` (B, H, T), if given, is ∂L/∂lse (natural units): since ∂lse/∂s = P,
    it enters as dS = P ∘ (dP − δ + dlse), i.e. δ is replaced by δ − dlse.
    """
    B, H, T, D, S, Hkv = inputs.B, inputs.H, inputs.T, inputs.D, inputs.S, inputs.Hkv
    q, k, v = inputs.q, inputs.k, inputs.v
    if _is_empty(inputs):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dout = dout.to(q.dtype).contiguous()  # (B, H, T, D)
    out = out.contiguous()
    # δ = rowsum(dout ⊙ out), FlashAttention-2's form (FA2 a2.L4), not flash.py's
    # Σ P ⊙ dP / Σ P. flash.py computes its δ in a first pass over every tile, from the
    # same P and dP the main pass uses, because on some BLAS kernels the rounding of a
    # float32 out made its dq 2-3x less accurate than the plain backward's. Here that
    # pass would add two tile matmuls (q kᵀ and dout vᵀ again) to the backward's seven,
    # about 30% more work, to remove a rounding the kernels already have elsewhere: in
    # float16/bfloat16, P is rounded to that dtype for the tensor-core dots, the same
    # size as the rounding of out. In float32, measured under the interpreter (whose
    # dots are NumPy's, run under OpenBLAS's Haswell and SkylakeX kernels both), dq
    # stays within 0.6-1.2x the plain float32 backward's error against float64 on the
    # tier's shapes (tests/triton holds it to FlashAttention's 2x rule).
    delta = torch.empty((B, H, T), device=q.device, dtype=torch.float32)  # (B, H, T)
    with _on_device(q):
        kernels.flash_delta_kernel[(triton.cdiv(T, _DELTA_BLOCK), B * H)](
            out, dout, delta, T, HEAD_DIM=D, BLOCK_M=_DELTA_BLOCK,
        )
    if dlse is not None:
        delta = delta - dlse.to(torch.float32)  # (B, H, T)
    dq = torch.empty_like(q)  # (B, H, T, D)
    dk = torch.empty_like(k)  # (B, Hkv, S, D)
    dv = torch.empty_like(v)  # (B, Hkv, S, D)
    padding = inputs.padding if inputs.padding is not None else q
    qk_scale, group, launch = inputs.scale * _LOG2E, H // Hkv, _launch_args(inputs)

    def dq_grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (triton.cdiv(T, meta["BLOCK_M"]), B * H)

    def dkdv_grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (triton.cdiv(S, meta["BLOCK_N"]), B * Hkv)

    with _on_device(q):
        _dq_kernel[dq_grid](q, k, v, dout, lse2, delta, dq, padding,
                            qk_scale, inputs.scale, T, S, H, group, **launch)
        _dkdv_kernel[dkdv_grid](q, k, v, dout, lse2, delta, dk, dv, padding,
                                qk_scale, inputs.scale, T, S, H, group, **launch)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """autograd for the Triton kernels: (q, k, v) -> (out, lse), both differentiable."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inputs: FlashInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out, lse2 = forward(inputs)
        ctx.save_for_backward(q, k, v, out, lse2)
        ctx.options = (inputs.padding, inputs.is_causal, inputs.scale)
        return out, lse2 * _LN2  # (B, H, T, D), (B, H, T) natural log

    @staticmethod
    def backward(
        ctx: Any, dout: torch.Tensor | None, dlse: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse2 = ctx.saved_tensors
        inputs = FlashInputs(q, k, v, *ctx.options)
        if dout is None:  # only lse is used downstream
            dout = torch.zeros_like(out)
        dq, dk, dv = backward(inputs, out, lse2, dout, dlse)
        return dq, dk, dv, None


# ----------------------------------------------------------------- public functions


@overload
def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = ...,
    key_padding: torch.Tensor | None = ..., scale: float | None = ...,
    return_lse: Literal[False] = ...,
) -> torch.Tensor: ...
@overload
def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = ...,
    key_padding: torch.Tensor | None = ..., scale: float | None = ...,
    return_lse: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...
def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention in Triton kernels (FlashAttention-2), with autograd.

    Shapes:
        q            (B, H, T, D)     queries
        k            (B, Hkv, S, D)   keys; H % Hkv == 0 (grouped-query attention)
        v            (B, Hkv, S, D)   values
        key_padding  bool (B, S); True = a real token (may be attended to)
        ->           out (B, H, T, D), and lse (B, H, T) float32 if ``return_lse``

    Equivalent to the following (``repeat_interleave`` gives each query head
    its key/value head)::

        k, v   = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))  # (B, H, S, D)
        scaled = q @ kᵀ · scale, -inf where not allowed                # (B, H, T, S)
        out    = softmax(scaled) @ v      (a row with nothing allowed -> 0)
        lse    = logsumexp(scaled, dim=-1)  (natural log; -inf for such a row)

    with allowed = key_padding[b, j] and, if ``is_causal``, j <= i + S − T
    (bottom-right). ``lse`` is what :func:`attnlab.merge_partials` (and ring
    attention) combine partial results with; it is differentiable, as ``out`` is.

    Dtypes: float16, bfloat16 and float32 (mixed inputs are promoted), with
    float32 accumulation; ``out`` is in the inputs' dtype, ``lse`` float32.
    float32 dots are IEEE (not TF32). D is one of 16, 32, 64, 128.

    Device: CUDA tensors; or, with ``TRITON_INTERPRET=1`` set before triton is
    first imported, CPU tensors run through Triton's interpreter (float16 and
    float32 only: its dot cannot compute bfloat16). Anything else is refused
    with an :class:`attnlab.AttnlabError` naming the argument, as are shapes,
    flags and scales the rest of attnlab refuses.
    """
    return_lse = check_flag(return_lse, "return_lse")
    inputs = check_flash_inputs(q, k, v, is_causal, key_padding, scale)
    out, lse = FlashAttentionFunction.apply(inputs.q, inputs.k, inputs.v, inputs)
    return (out, lse) if return_lse else out


def flash_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    *,
    is_causal: bool = False,
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of :func:`flash_attention` from a forward's out and lse, without autograd.

    Shapes:
        q, k, v, key_padding   as in the forward
        out   (B, H, T, D)     the forward's output
        lse   (B, H, T)        the forward's log-sum-exp (natural log, ``return_lse=True``)
        dout  (B, H, T, D)     ∂L/∂out
        ->    dq (B, H, T, D), dk (B, Hkv, S, D), dv (B, Hkv, S, D)

    The twin of :func:`attnlab.flash_attention_backward`. It is the local step of a
    ring-attention backward: with ``out`` and ``lse`` the *merged* results over
    every key shard, each shard's call gives that shard's exact share of dq and its
    own dk, dv (the weights rebuilt from the global lse are the global softmax's).
    ``lse`` is turned into base 2 (· log2 e), which costs about one float32 rounding.
    """
    inputs = check_flash_inputs(q, k, v, is_causal, key_padding, scale)
    B, H, T, D = inputs.B, inputs.H, inputs.T, inputs.D
    for name, t, shape, layout in (("out", out, (B, H, T, D), "(B, H, T, D)"),
                                   ("lse", lse, (B, H, T), "(B, H, T)"),
                                   ("dout", dout, (B, H, T, D), "(B, H, T, D)")):
        t = as_float_tensor(t, name)
        if tuple(t.shape) != shape:
            raise ShapeError(f"{name}: expected {layout} = {shape_str(shape)}, "
                             f"got {shape_str(t.shape)}")
        check_same_device(inputs.q, "q", t, name)
    lse2 = (lse.to(torch.float32) * _LOG2E).contiguous()  # (B, H, T) base 2
    with torch.no_grad():
        return backward(inputs, out.to(inputs.q.dtype), lse2, dout, None)
