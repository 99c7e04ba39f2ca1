"""attnlab.torch — the PyTorch layer of attnlab.

Everything here behaves identically to its NumPy twin in the core (same shapes,
same bool mask convention with **True = may attend**, same bottom-right causal
alignment, rows with nothing to attend to give 0), takes the same parameters in
the same order (plus ``device``, ``dtype``, ``generator`` and dropout where torch
has them) and is tested against it to float64 precision. Importing ``attnlab``
never imports torch; importing ``attnlab.torch`` without torch installed raises
an ImportError saying what to install.

Dimension legend: B batch, H heads, T query length, S key length, D head dim,
Dv value dim, E model width.

=================================================  =========================================
attnlab.torch                                      NumPy core
=================================================  =========================================
``scaled_dot_product_attention(q, k, v, mask)``    ``attnlab.scaled_dot_product_attention``
``softmax(x)``, ``causal_mask(T, S)``              ``attnlab.softmax``, ``attnlab.causal_mask``
``sliding_window_mask(T, window, is_causal=)``     ``attnlab.sliding_window_mask``
``MultiHeadAttention(num_heads, d_model)``         ``attnlab.MultiHeadAttention.init``
``SelfAttentionLayer(d_model, num_heads)``         ``attnlab.SelfAttentionLayer``
``LayerNorm(d_model)``                             ``attnlab.LayerNorm``
``KVCache``, ``SlidingWindowKVCache``              the same names in ``attnlab``
``PagedKVCache``                                   ``attnlab.PagedKVCache``
``PositionalEncoding(d_model)``                    ``positional.SinusoidalPositionalEncoding``
``sinusoidal_encoding``                            the same name in ``attnlab.positional``
``apply_rope``, ``rope_angles``,                   the same names in
``alibi_slopes``, ``alibi_bias``                   ``attnlab.positional_relative``
``varlen_attention(q, k, v, cu_seqlens_q, ...)``   ``attnlab.fast.varlen.varlen_attention``
``from_numpy(obj)`` / ``to_numpy(module)``         move parameters between the two
=================================================  =========================================

``to_torch_multihead`` / ``from_torch_multihead`` move parameters to and from
``torch.nn.MultiheadAttention`` (whose masks mean the opposite: True = blocked).
:mod:`attnlab.torch.compat` speaks torch's conventions instead (a drop-in
``nn.MultiheadAttention`` and ``F.scaled_dot_product_attention`` computed by
attnlab); :mod:`attnlab.torch.models` holds MiniLM/BERT as a trainable module.

Checks: by default only what metadata says (types, dtypes, shapes, devices,
flags, scales), so a call costs what torch's own costs, never waits for the
device and compiles without graph breaks. Inside ``with debug_checks():``
every call also reads the values: NaN/Inf inputs, NaN/+inf biases and scores
that would overflow are refused with an :class:`attnlab.AttnlabError`.
"""

from ..errors import missing_extra

try:
    import torch  # noqa: F401
except ImportError:
    raise missing_extra("torch", "torch", "attnlab.torch") from None

from .attention import scaled_dot_product_attention, softmax
from .convert import from_numpy, from_torch_multihead, to_numpy, to_torch_multihead
from .debug import debug_checks, debug_checks_enabled
from .kv_cache import KVCache, SlidingWindowKVCache
from .layers import LayerNorm, SelfAttentionLayer
from .masks import causal_mask, sliding_window_mask, window_mask
from .multihead import MultiHeadAttention
from .paged_cache import PagedKVCache
from .positional import (
    PositionalEncoding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_angles,
    sinusoidal_encoding,
)
from .varlen import varlen_attention

__all__ = [
    "KVCache",
    "LayerNorm",
    "MultiHeadAttention",
    "PagedKVCache",
    "PositionalEncoding",
    "SelfAttentionLayer",
    "SlidingWindowKVCache",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "causal_mask",
    "debug_checks",
    "debug_checks_enabled",
    "from_numpy",
    "from_torch_multihead",
    "rope_angles",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
    "sliding_window_mask",
    "softmax",
    "to_numpy",
    "to_torch_multihead",
    "varlen_attention",
    "window_mask",
]
