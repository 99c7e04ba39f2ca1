"""A tiny causal language model built from attnlab blocks, with cached generation.

Dimension legend: B batch, T tokens in this call, S keys attended to, H query
heads, Hkv key/value heads, D head dim, E model width, F feed-forward width,
V vocabulary size, L layers, N new tokens.

The model (GPT-2's layout, with RoPE instead of a position table)::

    x      = embedding[ids]                                   (B, T, E)
    block  : h = x + CausalSelfAttention(LN1(x))              pre-LN
             x = h + FFN(LN2(h))
    logits = LN_f(x) @ W_head                                 (B, T, V)

Each block is an :class:`attnlab.EncoderBlock` (``norm="pre"``, no dropout)
whose self-attention is made causal, optionally rotated by RoPE at absolute
positions, optionally restricted to a sliding window of W keys (including the
current token). The weights are random, drawn from a seed: the model exists to
show, on a real decoding loop, that cached decoding gives the same tokens as
recomputing the whole sequence, and how much faster it is.

Two paths, one answer: ``forward(ids)`` without caches is the plain causal
forward over the whole sequence; ``forward(ids, caches=...)`` runs only the new
tokens against :class:`attnlab.KVCache` (or :class:`attnlab.SlidingWindowKVCache`)
state. ``generate(..., use_cache=False)`` calls the first at every step,
``use_cache=True`` the second; the tests check both give the same tokens and
logits.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import InitVar, dataclass
from typing import Any, Literal

import numpy as np

from ..checks import as_array, check_alloc, check_flag, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..fast.kv_cache import KVCache, SlidingWindowKVCache
from ..fast.sparse import sliding_window_mask
from ..hooks import HookSite, any_attached
from ..init import RngLike, as_rng, init_weight
from ..masked_softmax import stable_softmax
from .layers import EncoderBlock, FeedForward, LayerNorm
from .multihead import MultiHeadAttention, linear, merge_heads

__all__ = ["DecoderConfig", "DecoderBlock", "TinyDecoder", "Generation"]

Cache = KVCache | SlidingWindowKVCache


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes and options of :class:`TinyDecoder`.

    ``pos`` is the positional encoding: "rope" (queries and keys rotated at their
    absolute positions) or "none" (the name ``explain(pos=)`` uses); ``rope=True`` /
    ``rope=False`` is its former spelling (deprecated, warns). ``window`` (W)
    restricts attention to W keys including the current token (None: full causal
    attention); ``max_len`` fixes the caches' size (None: they grow); ``dtype`` is
    "float32" or "float64".
    """

    vocab_size: int = 256
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int | None = None
    num_layers: int = 2
    d_ff: int = 256
    activation: str = "gelu_tanh"
    pos: Literal["rope", "none"] = "rope"
    rope_base: float = 10000.0
    window: int | None = None
    max_len: int | None = None
    dtype: str = "float32"
    rope: InitVar[bool | None] = None

    def __post_init__(self, rope: bool | None) -> None:
        if rope is not None:
            warnings.warn("DecoderConfig(rope=...) is deprecated: say pos='rope' or "
                          "pos='none'", DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "pos", "rope" if check_flag(rope, "rope") else "none")
        for name in ("vocab_size", "d_model", "num_heads", "num_layers", "d_ff"):
            check_positive_int(getattr(self, name), name)
        H = self.num_heads
        Hkv = H if self.num_kv_heads is None else check_positive_int(
            self.num_kv_heads, "num_kv_heads"
        )
        if H % Hkv:
            raise AttnlabError(f"num_kv_heads: expected a divisor of num_heads = {H}, got {Hkv}")
        if self.d_model % H:
            raise AttnlabError(
                f"d_model: expected a multiple of num_heads = {H}, got {self.d_model}"
            )
        if self.pos not in ("rope", "none"):
            raise AttnlabError(f"pos: expected 'rope' or 'none', got {self.pos!r}")
        if self.pos == "rope" and (self.d_model // H) % 2:
            raise AttnlabError(
                f"d_model: RoPE needs an even head dim D = d_model / num_heads, "
                f"got D = {self.d_model // H}"
            )
        if self.activation not in ("relu", "gelu", "gelu_tanh"):
            raise AttnlabError(
                f"activation: expected 'relu', 'gelu' or 'gelu_tanh', got {self.activation!r}"
            )
        if self.window is not None:
            check_positive_int(self.window, "window")
        if self.max_len is not None:
            check_positive_int(self.max_len, "max_len")
        if self.dtype not in ("float32", "float64"):
            raise AttnlabError(f"dtype: expected 'float32' or 'float64', got {self.dtype!r}")


@dataclass
class Generation:
    """The result of :meth:`TinyDecoder.generate`.

    tokens: (B, T0 + N) int64, the prompt followed by the N new tokens
    logits: (B, N, V), the logits each new token was chosen from
    """

    tokens: np.ndarray
    logits: np.ndarray
    prompt_len: int

    @property
    def new_tokens(self) -> np.ndarray:  # (B, N)
        return self.tokens[:, self.prompt_len :]


class DecoderBlock:
    """Pre-LN causal block: ``h = x + Attn(LN1(x)); out = h + FFN(LN2(h))``.

    Shapes: x (B, T, E) -> (B, T, E).

    Wraps an :class:`attnlab.EncoderBlock` with ``norm="pre"`` and uses its
    parameters: ``block.attn`` (MultiHeadAttention, GQA and RoPE allowed, no
    ALiBi), ``block.norm1``, ``block.ffn``, ``block.norm2``. ``window`` (W)
    restricts each query to W keys including itself.

    Without a cache the call *is* the block's own forward,
    ``block(x, mask=sliding_window_mask(T, W, is_causal=True) or None, is_causal=True)``: the
    plain twin. With one, only the new tokens are computed (:meth:`step`).
    """

    def __init__(self, block: EncoderBlock, *, window: int | None = None) -> None:
        if not isinstance(block, EncoderBlock) or block.norm != "pre":
            raise AttnlabError("block: expected an EncoderBlock with norm='pre'")
        if block.attn.alibi:
            raise AttnlabError("block: ALiBi is not supported by the cached path, got alibi=True")
        self.block = block
        self.window = None if window is None else check_positive_int(window, "window")

    def __call__(self, x: np.ndarray, cache: Cache | None = None) -> np.ndarray:
        if cache is not None:
            return self.step(x, cache)
        T = x.shape[-2]
        mask = (None if self.window is None
                else sliding_window_mask(T, self.window, is_causal=True))  # (T, T)
        return self.block(x, mask=mask, is_causal=True)  # (B, T, E)

    def step(self, x: np.ndarray, cache: Cache) -> np.ndarray:
        """The T new tokens x (B, T, E), at positions ``cache.length ..`` -> (B, T, E).

        Their keys and values (rotated by RoPE at those absolute positions) are
        appended to ``cache``, whose window must be this block's.
        """
        cache_window = getattr(cache, "window", None)
        if cache_window != self.window:
            raise AttnlabError(
                f"cache: expected a cache with window = {self.window} (this block's), "
                f"got window = {cache_window}"
            )
        block, mha = self.block, self.block.attn
        if any_attached(block):
            raise AttnlabError("caches: the cached path has no hook points; with hooks "
                               "attached run the model without caches")
        normed = block.norm1(x)  # (B, T, E)
        q, k, v = mha.project(normed, normed)  # (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, Dv)
        if mha.rope is not None:
            positions = cache.next_positions(x.shape[-2])  # (T,) absolute
            q = mha.rope(q, positions)  # (B, H, T, D)
            k = mha.rope(k, positions)  # (B, Hkv, T, D)
        heads = cache.attend(q, k, v, scale=mha.scale)  # (B, H, T, Dv)
        h = x + linear(merge_heads(heads), mha.Wo, mha.bo)  # (B, T, E)
        return h + block.ffn(block.norm2(h))  # (B, T, E)


class TinyDecoder:
    """A small causal language model with random weights; see the module docstring.

    >>> model = TinyDecoder(DecoderConfig(vocab_size=50, d_model=16, num_heads=2), seed=0)
    >>> model(np.array([[1, 2, 3]])).shape                  # logits (B, T, V)
    (1, 3, 50)
    >>> out = model.generate([1, 2, 3], 4)
    >>> out.tokens.shape, out.logits.shape
    ((1, 7), (1, 4, 50))
    >>> bool((out.tokens == model.generate([1, 2, 3], 4, use_cache=False).tokens).all())
    True
    """

    def __init__(self, config: DecoderConfig | None = None, *, seed: RngLike = 0) -> None:
        self.config = cfg = DecoderConfig() if config is None else config
        if not isinstance(cfg, DecoderConfig):
            raise AttnlabError(f"config: expected a DecoderConfig, got {type(cfg).__name__}")
        rng = as_rng(seed)
        dtype = np.dtype(cfg.dtype)
        E, V = cfg.d_model, cfg.vocab_size
        check_alloc((V, E), dtype, "the embedding (V, E)", "vocab_size, d_model")
        check_alloc((E, cfg.d_ff), dtype, "the feed-forward weight (E, d_ff)", "d_model, d_ff")
        self.embedding = rng.standard_normal((V, E)).astype(dtype)  # (V, E)
        self.blocks: list[DecoderBlock] = []
        for _ in range(cfg.num_layers):
            attn = MultiHeadAttention.init(
                cfg.num_heads, E, num_kv_heads=cfg.num_kv_heads, rope=cfg.pos == "rope",
                rope_base=cfg.rope_base, seed=rng, dtype=dtype,
            )
            ffn = FeedForward(E, cfg.d_ff, activation=cfg.activation, seed=rng)
            ffn = FeedForward.from_weights(
                ffn.W1.astype(dtype), ffn.b1.astype(dtype), ffn.W2.astype(dtype),
                ffn.b2.astype(dtype), activation=cfg.activation,
            )
            block = EncoderBlock.from_parts(
                attn, _layer_norm(E, dtype), ffn, _layer_norm(E, dtype), norm="pre", dropout=0.0
            )
            self.blocks.append(DecoderBlock(block, window=cfg.window))
        self.norm_f = _layer_norm(E, dtype)
        self.W_head = init_weight(E, V, "xavier", rng=rng).astype(dtype)  # (E, V)

    @property
    def dtype(self) -> np.dtype:
        return self.embedding.dtype

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_embed`` (B, T, E), every block's points under ``blocks.{l}`` (pre-LN
        :class:`attnlab.EncoderBlock`), ``ln_final.hook_normalized``. Only the forward
        without caches has them."""
        return ["hook_embed", *((f"blocks.{i}", b.block) for i, b in enumerate(self.blocks)),
                ("ln_final", self.norm_f)]

    def new_caches(self, batch: int = 1) -> list[Cache]:
        """One empty cache per layer: sliding-window if ``config.window`` is set."""
        cfg = self.config
        B = check_positive_int(batch, "batch")
        Hkv = cfg.num_kv_heads or cfg.num_heads
        D = cfg.d_model // cfg.num_heads
        if cfg.window is not None:
            return [SlidingWindowKVCache(B, Hkv, D, window=cfg.window, dtype=self.dtype)
                    for _ in self.blocks]
        return [KVCache(B, Hkv, D, max_len=cfg.max_len, dtype=self.dtype) for _ in self.blocks]

    def __call__(self, ids: Any, caches: Sequence[Cache] | None = None) -> np.ndarray:
        return self.forward(ids, caches)

    def forward(self, ids: Any, caches: Sequence[Cache] | None = None) -> np.ndarray:
        """Logits of every position: ids (B, T) -> (B, T, V).

        Without ``caches``: the plain causal forward over the whole sequence.
        With them (from :meth:`new_caches`): ids are the T new tokens after the
        ``caches[0].length`` tokens already seen, and the caches are updated.
        """
        tokens = self._check_ids(ids, "ids")
        if caches is not None:
            if len(caches) != len(self.blocks):
                raise AttnlabError(
                    f"caches: expected one cache per layer ({len(self.blocks)}), "
                    f"got {len(caches)}"
                )
            cache_batch = caches[0].batch
            if tokens.shape[0] != cache_batch:
                raise ShapeError(
                    f"ids: expected (B, T) with B = {cache_batch} as the caches, "
                    f"got {shape_str(tokens.shape)}"
                )
        x = self.embedding[tokens]  # (B, T, E)
        if self.hook_site is not None:
            x = self.hook_site("hook_embed", x)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])  # (B, T, E)
        return linear(self.norm_f(x), self.W_head, None)  # (B, T, V)

    def generate(
        self,
        prompt_ids: Any,
        max_new_tokens: int,
        *,
        use_cache: bool = True,
        greedy: bool = True,
        temperature: float = 1.0,
        seed: RngLike = 0,
    ) -> Generation:
        """Continue ``prompt_ids`` (B, T0) by ``max_new_tokens`` tokens ((T0,) means B = 1).

        ``use_cache=True`` prefills KV caches with the prompt, then runs one
        token per step; ``use_cache=False`` recomputes the whole sequence at
        every step (the plain twin). ``greedy`` takes the argmax; otherwise each
        token is sampled from softmax(logits / temperature) with a generator
        seeded by ``seed``.

        Returns a :class:`Generation`: tokens (B, T0 + N) and logits (B, N, V).
        """
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        N = check_positive_int(max_new_tokens, "max_new_tokens", allow_zero=True)
        use_cache = check_flag(use_cache, "use_cache")
        greedy = check_flag(greedy, "greedy")
        if isinstance(temperature, bool) or not isinstance(
            temperature, (int, float, np.floating)
        ) or not (0.0 < float(temperature) < np.inf):
            raise AttnlabError(f"temperature: expected a number > 0, got {temperature!r}")
        B, T0 = prompt.shape
        if T0 == 0:
            raise ShapeError("prompt_ids: expected at least one token, got (B, 0)")
        max_len = self.config.max_len
        if use_cache and max_len is not None and T0 + N > max_len:
            raise AttnlabError(
                f"max_new_tokens: the prompt ({T0}) plus {N} new tokens exceed the caches' "
                f"max_len = {max_len}; expected max_new_tokens <= {max(max_len - T0, 0)}"
            )
        check_alloc((B, N, self.config.vocab_size), self.dtype, "the logits (B, N, V)",
                    "max_new_tokens")
        rng = as_rng(seed)
        tokens = np.empty((B, T0 + N), dtype=np.int64)  # (B, T0 + N)
        tokens[:, :T0] = prompt
        chosen_logits = np.empty((B, N, self.config.vocab_size), dtype=self.dtype)  # (B, N, V)
        caches = self.new_caches(B) if use_cache else None
        for step in range(N):
            end = T0 + step
            if caches is None:
                last = self.forward(tokens[:, :end])[:, -1]  # (B, V)
            else:
                new = tokens[:, :end] if step == 0 else tokens[:, end - 1 : end]  # (B, T)
                last = self.forward(new, caches)[:, -1]  # (B, V)
            chosen_logits[:, step] = last
            tokens[:, end] = _pick(last, greedy, float(temperature), rng)
        return Generation(tokens, chosen_logits, T0)

    def _check_ids(self, ids: Any, name: str) -> np.ndarray:  # -> (B, T) int64
        arr = as_array(ids, name)
        if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
            raise AttnlabError(f"{name}: expected integer token ids, got dtype {arr.dtype}")
        if arr.ndim == 1:
            arr = arr[None, :]  # (1, T)
        if arr.ndim != 2:
            raise ShapeError(f"{name}: expected (B, T) or (T,), got {shape_str(arr.shape)}")
        V = self.config.vocab_size
        if arr.size and (arr.min() < 0 or arr.max() >= V):
            bad = arr[(arr < 0) | (arr >= V)].ravel()[0]
            raise AttnlabError(f"{name}: expected token ids in [0, {V}), got {int(bad)}")
        return arr.astype(np.int64, copy=False)


def _pick(logits: np.ndarray, greedy: bool, temperature: float, rng: np.random.Generator
          ) -> np.ndarray:  # (B, V) -> (B,)
    if greedy:
        return np.argmax(logits, axis=-1)  # (B,)
    # Shift before dividing: every shifted logit is <= 0, so a tiny temperature sends
    # the others to -inf (weight 0) and the largest to 0 (weight 1): greedy, never
    # the NaN that (logits / T) overflowing to inf - inf gave.
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)  # (B, V)
    with np.errstate(over="ignore"):
        probs = stable_softmax(shifted / temperature, in_place=True)  # (B, V)
    cdf = np.cumsum(probs, axis=-1)  # (B, V)
    draws = rng.random(logits.shape[0]) * cdf[:, -1]  # (B,)
    return np.minimum((cdf <= draws[:, None]).sum(axis=-1), logits.shape[-1] - 1)  # (B,)


def _layer_norm(E: int, dtype: np.dtype) -> LayerNorm:
    """LayerNorm with its gamma and beta in ``dtype`` (so float32 stays float32)."""
    return LayerNorm(E, gamma=np.ones(E, dtype), beta=np.zeros(E, dtype))
