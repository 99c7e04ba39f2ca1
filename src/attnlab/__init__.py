"""attnlab — Transformer self-attention from scratch, exact and inspectable.

Dimension legend, used in every docstring, shape comment and error message:

    B batch · H heads · T query length · S key length · D head dim
    Dv value dim · E model width

Mask convention: a bool array, **True = may attend**; additive values go
through ``bias``. See :mod:`attnlab.masks` to convert the seeds' 0/1 masks.
"""

from .attention import scaled_dot_product_attention, self_attention, softmax
from .backward import sdpa_backward, softmax_backward
from .errors import AttnlabError, ShapeError
from .fast.block_sparse import block_sparse_attention, block_sparse_mask
from .fast.flash import FlashStats, flash_attention, flash_attention_backward, merge_partials
from .fast.kv_cache import KVCache, SlidingWindowKVCache
from .fast.lowrank import linformer_attention, nystrom_attention
from .fast.paged_cache import PagedKVCache
from .fast.performer import performer_attention
from .fast.sparse import sliding_window_attention, sliding_window_mask
from .init import init_qkv, init_weight, xavier_normal, xavier_uniform
from .lens import grad_diagnostics
from .lens.explain import explain, token_embeddings
from .masks import (
    causal_mask,
    from_blocked,
    from_keep,
    mask_to_bias,
    padding_mask,
    window_mask,
)
from .nn.backward import layer_norm_backward, mha_backward
from .nn.decoder import DecoderConfig, TinyDecoder
from .nn.layers import Dropout, EncoderBlock, FeedForward, LayerNorm, SelfAttentionLayer, gelu
from .nn.multihead import MultiHeadAttention
from .positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)
from .positional_relative import RotaryEmbedding, alibi_bias, alibi_slopes, apply_rope
from .trace import Recorder, Step, Trace

__version__ = "0.1.0"

__all__ = [
    "AttnlabError",
    "DecoderConfig",
    "Dropout",
    "EncoderBlock",
    "FeedForward",
    "FlashStats",
    "KVCache",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PagedKVCache",
    "Recorder",
    "RotaryEmbedding",
    "SelfAttentionLayer",
    "ShapeError",
    "SlidingWindowKVCache",
    "SinusoidalPositionalEncoding",
    "Step",
    "TinyDecoder",
    "Trace",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "block_sparse_attention",
    "block_sparse_mask",
    "causal_mask",
    "explain",
    "flash_attention",
    "flash_attention_backward",
    "from_blocked",
    "from_keep",
    "gelu",
    "grad_diagnostics",
    "init_qkv",
    "init_weight",
    "layer_norm_backward",
    "linformer_attention",
    "mask_to_bias",
    "merge_partials",
    "mha_backward",
    "nystrom_attention",
    "padding_mask",
    "performer_attention",
    "scaled_dot_product_attention",
    "sdpa_backward",
    "self_attention",
    "sinusoidal_encoding",
    "sliding_window_attention",
    "sliding_window_mask",
    "softmax",
    "softmax_backward",
    "token_embeddings",
    "window_mask",
    "xavier_normal",
    "xavier_uniform",
]
