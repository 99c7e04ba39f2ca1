"""attnlab.triton — flash attention as Triton GPU kernels, forward and backward.

:func:`flash_attention` is FlashAttention-2 (the algorithm of Triton's
fused-attention tutorial) written step for step beside attnlab's NumPy
:func:`attnlab.fast.flash.flash_attention`: the same tiles, online softmax,
stored log-sum-exp and rebuilt weights, on a GPU. It takes torch tensors
(B, H, T, D) / (B, Hkv, S, D) and is differentiable (``torch.autograd``).

Dimension legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length, D head dim. Mask convention: ``key_padding`` bool (B, S), **True =
a real token**; ``is_causal`` is bottom-right aligned, as everywhere in attnlab.

=========================================  =============================================
attnlab.triton                             NumPy twin
=========================================  =============================================
``flash_attention(q, k, v, *, ...)``       ``attnlab.flash_attention``
``flash_attention_backward(...)``          ``attnlab.flash_attention_backward``
=========================================  =============================================

``attnlab.torch.scaled_dot_product_attention(q, k, v, backend="triton")``
selects these kernels from the torch layer.

For ring attention's local step on GPUs: ``flash_attention(q, k_shard,
v_shard, return_lse=True)`` gives a shard's (out, lse), lse in natural log and
float32, which :func:`attnlab.merge_partials` combines unchanged; and
:func:`flash_attention_backward` with the merged out and lse gives that
shard's dq, dk, dv.

Runs on CUDA tensors. Tests run the same kernels on the CPU through Triton's
interpreter: set ``TRITON_INTERPRET=1`` before triton is first imported
(float16 and float32 only there). Needs the ``triton`` package
(``pip install 'attnlab[triton]'``).
"""

from ..errors import missing_extra

try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError as error:
    raise missing_extra(error.name or "triton", "triton", "attnlab.triton") from None

from .flash import HEAD_DIMS, flash_attention, flash_attention_backward, interpreting

__all__ = ["HEAD_DIMS", "flash_attention", "flash_attention_backward", "interpreting"]
