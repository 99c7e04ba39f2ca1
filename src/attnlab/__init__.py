"""attnlab — Transformer self-attention from scratch, exact and inspectable.

Dimension legend, used in every docstring, shape comment and error message:

    B batch · H heads · T query length · S key length · D head dim
    Dv value dim · E model width

Mask convention: a bool array, **True = may attend**; additive values go
through ``bias``. See :mod:`attnlab.masks` to convert the seeds' 0/1 masks.
"""

from .attention import scaled_dot_product_attention, self_attention, softmax
from .errors import AttnlabError, ShapeError
from .explain import explain, token_embeddings
from .init import init_qkv, init_weight, xavier_normal, xavier_uniform
from .layers import Dropout, EncoderBlock, FeedForward, LayerNorm, SelfAttentionLayer, gelu
from .masks import causal_mask, from_blocked, from_keep, mask_to_bias, padding_mask
from .multihead import MultiHeadAttention
from .trace import Step, Trace

__version__ = "0.1.0"

__all__ = [
    "AttnlabError",
    "Dropout",
    "EncoderBlock",
    "FeedForward",
    "LayerNorm",
    "MultiHeadAttention",
    "SelfAttentionLayer",
    "ShapeError",
    "Step",
    "Trace",
    "causal_mask",
    "explain",
    "from_blocked",
    "from_keep",
    "gelu",
    "init_qkv",
    "init_weight",
    "mask_to_bias",
    "padding_mask",
    "scaled_dot_product_attention",
    "self_attention",
    "softmax",
    "token_embeddings",
    "xavier_normal",
    "xavier_uniform",
]
