"""Where the time goes: wall time and FLOPs of a BERT encoder, part by part.

Seed 001 says self-attention is "about 60%" of BERT-base's compute. Whether
that is true depends on two things this module makes explicit: what counts as
"self-attention" (with or without the Q/K/V/output projections, which are
ordinary matrix products linear in T) and the sequence length T (only the
score, softmax and weighted-sum steps grow like T²).

Parts of one forward pass (their group in brackets)::

    embeddings         word + position + token-type lookup, add, LayerNorm   [rest]
    qkv_projection     Q, K, V = X·Wq + bq, X·Wk + bk, X·Wv + bv, split heads [attention]
    scores             Q·Kᵀ per head                                           [attention]
    softmax            ·1/√D, mask, softmax over the keys                      [attention]
    weighted_sum       weights·V per head                                      [attention]
    output_projection  concat(heads)·Wo + bo                                   [attention]
    ffn_in             X·W1 + b1 (E → F)                                       [feed_forward]
    activation         GELU on (T, F)                                          [feed_forward]
    ffn_out            ·W2 + b2 (F → E)                                        [feed_forward]
    residual           the two residual adds of each layer                     [rest]
    layernorm          the two LayerNorms of each layer                        [rest]

"attention_core" is scores + softmax + weighted_sum (attention without its
projections); "projections" is qkv_projection + output_projection.

FLOP convention
---------------
A matrix product (m, k)·(k, n) is 2·m·k·n; every elementwise operation or
reduction over n elements is n, with exp, erf and tanh counted as one (so
softmax and GELU do more work per "FLOP" than a matrix product, which is one
reason their measured time share exceeds their FLOP share). Row-wise scalars
(a LayerNorm's mean divide, +eps, √) count once per row. The mask is a
select and counts 0. Per layer, for T queries over S = T keys, with
B batch · L layers · E width · H heads · Hkv key/value heads · D head dim
(Dv = D) · F feed-forward width (BERT: H·D = E, Hkv = H)::

    qkv_projection     2·T·E·(H·D + 2·Hkv·D) + T·(H·D + 2·Hkv·D)   = 6·T·E² + 3·T·E
    scores             2·H·T·S·D                                   = 2·T²·E
    softmax            6·H·T·S   (scale, max, subtract, exp, sum, divide)
    weighted_sum       2·H·T·S·D                                   = 2·T²·E
    output_projection  2·T·H·D·E + T·E                             = 2·T·E² + T·E
    ffn_in             2·T·E·F + T·F
    activation         5·T·F     (exact GELU: x/√2, erf, +1, ·x, ·½; tanh GELU 9, ReLU 1)
    ffn_out            2·T·F·E + T·E
    residual           2·T·E
    layernorm          2·(7·T·E + 4·T)

and once per forward ``embeddings = 9·T·E + 4·T`` (two adds, a LayerNorm).
Everything is multiplied by B (and the per-layer parts by L), so shares do not
depend on the batch size. Summed per layer (BERT, no GQA)::

    attention    = (8·E² + 4·E)·T + (4·E + 6·H)·T²
    feed_forward = (4·E·F + 6·F + E)·T
    rest         = (16·E + 8)·T                 (+ the embeddings, once)

Crossovers: attention's T² terms (scores, softmax, weighted sum) overtake the
feed-forward part at

    T* = (4·E·F + 6·F + E) / (4·E + 6·H)        ≈ F for E ≫ H

(3008 for BERT-base: E = 768, H = 12, F = 3072; 1473 for MiniLM-L6: E = 384,
F = 1536), and attention *with* its projections overtakes the feed-forward part
at T = (4·E·F + 6·F + E − 8·E² − 4·E) / (4·E + 6·H) (1506 for BERT-base, 739
for MiniLM). :func:`crossovers` solves these and the T at which attention's
share of all FLOPs reaches a given value (60% for seed 001's claim).

Timing
------
:func:`profiled_forward` runs the model's own primitives step by step
(``MultiHeadAttention.project``, ``linear``, ``merge_heads``, the library's
softmax, ``LayerNorm``, the activation) with a ``time.perf_counter`` lap after
each part, and gives the same hidden states as ``BertModel.forward`` (tested).
It skips the input validation the public calls do (an ``isfinite`` scan of
every argument), which :func:`measure` reports separately as the difference
between the normal forward's time and the sum of the parts. :func:`profile`
limits BLAS to ``threads`` threads with threadpoolctl while it measures.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AttnlabError, check_positive_int, missing_extra, shape_str
from ..kernel import MAX_SCORE_ELEMENTS, stable_softmax
from ..models.bert import _ACTIVATION, BertConfig, BertModel
from ..nn.layers import _ACTIVATIONS, EncoderBlock
from ..nn.multihead import linear, merge_heads

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PARTS", "GROUPS", "BERT_BASE", "TINY", "SCHEMA", "ModelShape", "PartTimer",
    "flop_polynomials", "flop_counts", "group_totals", "shares", "crossovers", "share_curve",
    "random_bert", "with_max_positions", "profiled_layers", "profiled_forward", "measure",
    "limit_threads", "profile", "plot_shares",
]

SCHEMA = "attnlab.studies.profile/1"

#: Part -> (group, what it computes), in the order a forward pass runs them.
PARTS: dict[str, tuple[str, str]] = {
    "embeddings": ("rest", "word + position + token-type lookup, add, LayerNorm"),
    "qkv_projection": ("attention", "Q, K, V = X·Wq + bq, X·Wk + bk, X·Wv + bv, split heads"),
    "scores": ("attention", "Q·Kᵀ per head"),
    "softmax": ("attention", "·1/√D, mask, softmax over the keys"),
    "weighted_sum": ("attention", "weights·V per head"),
    "output_projection": ("attention", "concat(heads)·Wo + bo"),
    "ffn_in": ("feed_forward", "X·W1 + b1 (E → F)"),
    "activation": ("feed_forward", "GELU (the model's activation) on (T, F)"),
    "ffn_out": ("feed_forward", "·W2 + b2 (F → E)"),
    "residual": ("rest", "the two residual adds of each layer"),
    "layernorm": ("rest", "the two LayerNorms of each layer"),
}

#: Group -> its parts. "attention_core" and "projections" split "attention".
GROUPS: dict[str, tuple[str, ...]] = {
    "attention": ("qkv_projection", "scores", "softmax", "weighted_sum", "output_projection"),
    "attention_core": ("scores", "softmax", "weighted_sum"),
    "projections": ("qkv_projection", "output_projection"),
    "feed_forward": ("ffn_in", "activation", "ffn_out"),
    "rest": ("embeddings", "residual", "layernorm"),
}

#: Elementwise operations per score (scale, max, subtract, exp, sum, divide).
SOFTMAX_OPS = 6
#: Elementwise operations per element of each activation (erf / tanh count one).
ACTIVATION_OPS = {"gelu": 5, "gelu_tanh": 9, "relu": 1}
#: LayerNorm: 7 per element (mean, subtract, square, mean, divide, ·γ, +β), 4 per row.
LAYERNORM_OPS = (7, 4)

BERT_BASE = BertConfig(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
    layer_norm_eps=1e-12,
)
"""bert-base-uncased's shape: 12 layers, 768 wide, 12 heads, FFN 3072."""

TINY = BertConfig(
    vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12,
)
"""A 2-layer, 32-wide BERT for quick runs and tests."""


# ---------------------------------------------------------------------- FLOPs


@dataclass(frozen=True)
class ModelShape:
    """The sizes FLOPs depend on: L layers, E width, H heads, F FFN width, Hkv, D."""

    layers: int
    width: int
    heads: int
    ffn: int
    kv_heads: int | None = None
    head_dim: int | None = None
    activation: str = "gelu"
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("layers", "width", "heads", "ffn"):
            check_positive_int(getattr(self, name), name)
        if self.head_dim is None and self.width % self.heads:
            raise AttnlabError(f"width: expected a multiple of heads = {self.heads} "
                               f"(or pass head_dim), got {self.width}")
        if self.heads % self.Hkv:
            raise AttnlabError(f"kv_heads: expected a divisor of heads = {self.heads}, "
                               f"got {self.kv_heads}")
        if self.activation not in ACTIVATION_OPS:
            raise AttnlabError(f"activation: expected one of {sorted(ACTIVATION_OPS)}, "
                               f"got {self.activation!r}")

    @property
    def Hkv(self) -> int:  # noqa: N802  (the legend's name)
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def D(self) -> int:  # noqa: N802
        return self.width // self.heads if self.head_dim is None else self.head_dim

    @classmethod
    def of(cls, model: BertModel | BertConfig) -> ModelShape:
        """The shape of a :class:`BertModel` (or of a config, with its activation)."""
        config = model.config if isinstance(model, BertModel) else model
        return cls(layers=config.num_hidden_layers, width=config.hidden_size,
                   heads=config.num_attention_heads, ffn=config.intermediate_size,
                   activation=_ACTIVATION[config.hidden_act])

    def as_dict(self) -> dict[str, Any]:
        return {"layers": self.layers, "width": self.width, "heads": self.heads,
                "kv_heads": self.Hkv, "head_dim": self.D, "ffn": self.ffn,
                "activation": self.activation, "bias": self.bias}


def flop_polynomials(shape: ModelShape) -> dict[str, tuple[int, int, int]]:
    """Part -> (a2, a1, a0): its FLOPs for one sequence are a2·T² + a1·T + a0 (S = T).

    Per-layer parts are already multiplied by L. See the module docstring for
    the formulas and the counting convention.
    """
    L, E, H, Hkv, D, F = shape.layers, shape.width, shape.heads, shape.Hkv, shape.D, shape.ffn
    b = int(shape.bias)
    ln_elem, ln_row = LAYERNORM_OPS
    per_layer = {
        "qkv_projection": (0, 2 * E * (H * D + 2 * Hkv * D) + b * (H * D + 2 * Hkv * D), 0),
        "scores": (2 * H * D, 0, 0),
        "softmax": (SOFTMAX_OPS * H, 0, 0),
        "weighted_sum": (2 * H * D, 0, 0),
        "output_projection": (0, 2 * H * D * E + b * E, 0),
        "ffn_in": (0, 2 * E * F + b * F, 0),
        "activation": (0, ACTIVATION_OPS[shape.activation] * F, 0),
        "ffn_out": (0, 2 * F * E + b * E, 0),
        "residual": (0, 2 * E, 0),
        "layernorm": (0, 2 * (ln_elem * E + ln_row), 0),
    }
    polys = {name: (L * a2, L * a1, L * a0) for name, (a2, a1, a0) in per_layer.items()}
    polys["embeddings"] = (0, 2 * E + ln_elem * E + ln_row, 0)
    return {name: polys[name] for name in PARTS}


def flop_counts(shape: ModelShape, T: int, *, batch: int = 1) -> dict[str, int]:
    """Part -> FLOPs of one forward pass over ``batch`` sequences of T tokens."""
    T = check_positive_int(T, "T")
    batch = check_positive_int(batch, "batch")
    return {name: batch * (a2 * T * T + a1 * T + a0)
            for name, (a2, a1, a0) in flop_polynomials(shape).items()}


def group_totals(parts: Mapping[str, float]) -> dict[str, float]:
    """Sum the parts into :data:`GROUPS` (plus "total")."""
    totals = {group: float(sum(parts[p] for p in members)) for group, members in GROUPS.items()}
    totals["total"] = float(sum(parts[p] for p in PARTS))
    return totals


def shares(parts: Mapping[str, float]) -> dict[str, float]:
    """Fraction of the total of every part and every group."""
    totals = group_totals(parts)
    total = totals.pop("total")
    out = {name: float(parts[name]) / total for name in PARTS}
    out.update({group: value / total for group, value in totals.items()})
    return out


def _group_poly(shape: ModelShape, group: str) -> np.ndarray:
    polys = flop_polynomials(shape)
    members = PARTS if group == "total" else GROUPS[group]
    return np.array([sum(polys[p][i] for p in members) for i in range(3)], dtype=np.float64)


def _smallest_positive_root(coeffs: np.ndarray) -> float | None:
    """Smallest T > 0 where the polynomial c2·T² + c1·T + c0 changes sign (None if never)."""
    trimmed = np.trim_zeros(coeffs, "f")
    if trimmed.size < 2:
        return None
    roots = [r.real for r in np.roots(trimmed) if abs(r.imag) < 1e-9 and r.real > 0]
    return float(min(roots)) if roots else None


def crossovers(shape: ModelShape, *, share: float = 0.6) -> dict[str, float | None]:
    """Sequence lengths T where the FLOP balance tips (None: never, for T > 0).

    - ``core_vs_ffn``: attention's T² parts (scores, softmax, weighted sum) = feed-forward;
    - ``attention_vs_ffn``: attention with its projections = feed-forward;
    - ``core_vs_linear``: the T² parts = all the T-linear parts together;
    - ``attention_share``: attention (with projections) is ``share`` of all FLOPs;
    - ``core_share``: attention's T² parts alone are ``share`` of all FLOPs.
    """
    if not 0.0 < share < 1.0:
        raise AttnlabError(f"share: expected a fraction in (0, 1), got {share!r}")
    core, attention = _group_poly(shape, "attention_core"), _group_poly(shape, "attention")
    ffn, total = _group_poly(shape, "feed_forward"), _group_poly(shape, "total")
    return {
        "core_vs_ffn": _smallest_positive_root(core - ffn),
        "attention_vs_ffn": _smallest_positive_root(attention - ffn),
        "core_vs_linear": _smallest_positive_root(core - (total - core)),
        "attention_share": _smallest_positive_root(attention - share * total),
        "core_share": _smallest_positive_root(core - share * total),
    }


def share_curve(shape: ModelShape, seq_lens: Sequence[int]) -> list[dict[str, float]]:
    """FLOP share of every part and group at each T: [{"T": T, part/group: share}, ...]."""
    return [{"T": float(T), **shares(flop_counts(shape, T))} for T in seq_lens]


# -------------------------------------------------------------------- models


def random_bert(config: BertConfig = BERT_BASE, *, seed: int = 0, std: float = 0.02,
                name: str | None = None) -> BertModel:
    """A :class:`BertModel` of ``config``'s shape with random float32 weights, no files.

    Weights are N(0, std²) (BERT's initializer_range 0.02), biases 0, LayerNorm
    γ = 1, β = 0; built through the same constructor as a pretrained model, so
    the layers are attnlab's :class:`~attnlab.EncoderBlock`.
    """
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for key, shape in config.expected_tensors().items():
        if key.endswith("LayerNorm.weight"):
            tensors[key] = np.ones(shape, dtype=np.float32)
        elif key.endswith("bias"):
            tensors[key] = np.zeros(shape, dtype=np.float32)
        else:
            tensors[key] = (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return BertModel(config, tensors, tokenizer=None, max_length=config.max_position_embeddings,
                     name=name or f"random-L{config.num_hidden_layers}-E{config.hidden_size}")


def with_max_positions(model: BertModel, positions: int) -> BertModel:
    """A shallow copy of ``model`` whose position table has ``positions`` rows.

    Rows past the trained table repeat it (row p reads row p mod P): the cost of
    a forward pass does not depend on the values, and the first P rows give the
    model's own results. The layers are shared with ``model``.
    """
    positions = check_positive_int(positions, "positions")
    table = model.position_embeddings  # (P, E)
    if positions <= table.shape[0]:
        return model
    extended = copy.copy(model)
    extended.config = dataclasses.replace(model.config, max_position_embeddings=positions)
    reps = math.ceil(positions / table.shape[0])
    extended.position_embeddings = np.ascontiguousarray(np.tile(table, (reps, 1))[:positions])
    return extended


# -------------------------------------------------------------------- timing


class PartTimer:
    """Accumulates wall time per part: ``lap(part)`` charges the time since the last lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PARTS, 0.0)
        self._last = time.perf_counter()

    def start(self) -> None:
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        self.seconds[part] += now - self._last
        self._last = now


def profiled_layers(
    layers: Sequence[EncoderBlock], x: Any, mask: Any = None, *, timer: PartTimer | None = None
) -> np.ndarray:
    """Run encoder blocks step by step, timing each part; equals ``layer(x, mask)`` in turn.

    Shapes: x (B, T, E); mask bool broadcastable to (B, H, T, T), True = may attend
    (e.g. key padding as (B, 1, 1, T)) -> (B, T, E).

    Equivalent to::

        for layer in layers:
            x = layer(x, mask)

    for blocks in evaluation mode, non-causal, without bias (BERT's encoder).
    """
    x_arr = np.asarray(x)
    if x_arr.ndim != 3 or not np.issubdtype(x_arr.dtype, np.floating):
        raise AttnlabError(f"x: expected a float (B, T, E) array, got {x_arr.dtype} "
                           f"{shape_str(x_arr.shape)}")
    allowed = None if mask is None else np.asarray(mask)
    if allowed is not None and allowed.dtype != np.bool_:
        raise AttnlabError(f"mask: expected a bool array (True = may attend), got {allowed.dtype}")
    clock = timer if timer is not None else PartTimer()
    clock.start()
    for index, layer in enumerate(layers):
        if layer.training:
            raise AttnlabError(f"layers[{index}]: expected evaluation mode (dropout off), "
                               "got training mode; call layer.eval()")
        x_arr = _profiled_block(layer, x_arr, allowed, clock)
    return x_arr


def _profiled_block(
    block: EncoderBlock, x: np.ndarray, allowed: np.ndarray | None, clock: PartTimer
) -> np.ndarray:
    """One block, the same operations in the same order as ``EncoderBlock.__call__``."""
    attn = block.attn
    B, T, E = x.shape
    n_scores = B * attn.num_heads * T * T
    if n_scores > MAX_SCORE_ELEMENTS:
        raise AttnlabError(f"x: the score matrix ({B}, {attn.num_heads}, {T}, {T}) would hold "
                           f"{n_scores:,} elements, more than attnlab.attention."
                           f"MAX_SCORE_ELEMENTS = {MAX_SCORE_ELEMENTS:,}")
    pre = block.norm == "pre"
    attn_in = x
    if pre:
        attn_in = block.norm1(x)  # (B, T, E)
        clock.lap("layernorm")
    q, k, v = attn.project(attn_in, attn_in)  # (B, H, T, D), (B, Hkv, T, D), (B, Hkv, T, Dv)
    k, v = attn.expand_kv(k), attn.expand_kv(v)  # (B, H, T, D), (B, H, T, Dv)
    clock.lap("qkv_projection")
    scores = q @ np.swapaxes(k, -1, -2)  # (B, H, T, S)
    clock.lap("scores")
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if D > 0 else 1.0  # as scaled_dot_product_attention
    scaled = scores * np.asarray(scale, dtype=scores.dtype)  # (B, H, T, S)
    if allowed is not None:
        scaled = np.where(allowed, scaled, -np.inf)  # (B, H, T, S)
    weights = stable_softmax(scaled, axis=-1)  # (B, H, T, S)
    clock.lap("softmax")
    heads = weights @ v  # (B, H, T, Dv)
    clock.lap("weighted_sum")
    out = linear(merge_heads(heads), attn.Wo, attn.bo)  # (B, T, E)
    clock.lap("output_projection")
    h = x + out  # (B, T, E); dropout is the identity in evaluation mode
    clock.lap("residual")
    if not pre:
        h = block.norm1(h)  # (B, T, E)
        clock.lap("layernorm")
    ffn_in = h
    if pre:
        ffn_in = block.norm2(h)  # (B, T, E)
        clock.lap("layernorm")
    ffn = block.ffn
    hidden = linear(ffn_in, ffn.W1, ffn.b1)  # (B, T, F)
    clock.lap("ffn_in")
    hidden = _ACTIVATIONS[ffn.activation](hidden)  # (B, T, F)
    clock.lap("activation")
    ffn_out = linear(hidden, ffn.W2, ffn.b2)  # (B, T, E)
    clock.lap("ffn_out")
    y = h + ffn_out  # (B, T, E)
    clock.lap("residual")
    if not pre:
        y = block.norm2(y)  # (B, T, E)
        clock.lap("layernorm")
    return y


def profiled_forward(
    model: BertModel, input_ids: Any, attention_mask: Any = None, *,
    timer: PartTimer | None = None,
) -> np.ndarray:
    """``model.forward(input_ids, attention_mask)`` run part by part, timed by ``timer``.

    Shapes: input_ids int (B, T), attention_mask (B, T) with 1 = real token -> (B, T, E).
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise AttnlabError(f"input_ids: expected integer (B, T), got {ids.dtype} "
                           f"{shape_str(ids.shape)}")
    real = np.ones(ids.shape, bool) if attention_mask is None else np.asarray(
        attention_mask).astype(bool)
    if real.shape != ids.shape:
        raise AttnlabError(f"attention_mask: expected {shape_str(ids.shape)} to match "
                           f"input_ids, got {shape_str(real.shape)}")
    clock = timer if timer is not None else PartTimer()
    clock.start()
    x = model.embed(ids)  # (B, T, E)
    clock.lap("embeddings")
    mask = real[:, None, None, :]  # (B, 1, 1, T): True = a real key, as BertModel.forward
    return profiled_layers(model.layers, x, mask, timer=clock)


def measure(model: BertModel, T: int, *, repeats: int = 5, batch: int = 1, seed: int = 0,
            compare_forward: bool = True) -> dict[str, Any]:
    """Time one model at one T: median seconds per part over ``repeats`` runs.

    One warm-up run first. With ``compare_forward`` the normal ``model.forward``
    is timed too, interleaved, to show what the instrumentation and the skipped
    validation amount to. Does not limit threads: see :func:`profile`.

    Returns {"T", "batch", "repeats", "seconds": {part: median}, "total_s" (sum of
    part medians), "forward_s" (median of model.forward, or None), "time_share",
    "flops", "flop_share"}.
    """
    T = check_positive_int(T, "T")
    repeats = check_positive_int(repeats, "repeats")
    batch = check_positive_int(batch, "batch")
    if T > model.config.max_position_embeddings:
        raise AttnlabError(f"T: expected at most {model.config.max_position_embeddings} "
                           f"(the model's position table), got {T}; see with_max_positions")
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000 if model.config.vocab_size > 2000 else 0,
                       model.config.vocab_size, size=(batch, T))  # (B, T)
    profiled_forward(model, ids)  # warm-up
    runs: dict[str, list[float]] = {part: [] for part in PARTS}
    forward_runs: list[float] = []
    for _ in range(repeats):
        timer = PartTimer()
        profiled_forward(model, ids, timer=timer)
        for part, elapsed in timer.seconds.items():
            runs[part].append(elapsed)
        if compare_forward:
            start = time.perf_counter()
            model.forward(ids)
            forward_runs.append(time.perf_counter() - start)
    seconds = {part: statistics.median(values) for part, values in runs.items()}
    flops = flop_counts(ModelShape.of(model), T, batch=batch)
    return {
        "T": T, "batch": batch, "repeats": repeats,
        "seconds": seconds,
        "total_s": float(sum(seconds.values())),
        "forward_s": statistics.median(forward_runs) if forward_runs else None,
        "time_share": shares(seconds),
        "flops": flops,
        "total_flops": int(sum(flops.values())),
        "flop_share": shares({k: float(v) for k, v in flops.items()}),
    }


@contextmanager
def limit_threads(threads: int) -> Iterator[None]:
    """Limit NumPy's BLAS (and OpenMP) pools to ``threads`` inside the block, then restore."""
    threads = check_positive_int(threads, "threads")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise missing_extra("threadpoolctl", "bench", "Profiling with a thread limit") from None
    with threadpool_limits(limits=threads):
        yield


def profile(
    models: Mapping[str, BertModel], seq_lens: Sequence[int], *, repeats: int = 5,
    threads: int = 1, batch: int = 1, seed: int = 0, compare_forward: bool = True,
    notes: Mapping[str, Sequence[str]] | None = None, curve: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Measure every model at every T; the report the CLI prints and writes as JSON.

    A model whose position table is shorter than T is extended with
    :func:`with_max_positions` (and a note says so). Schema (``SCHEMA``)::

        {"schema", "settings": {threads, repeats, batch, dtype, seq_lens, flop_convention},
         "parts": {part: {"group", "description"}}, "groups": {group: [parts]},
         "models": [{"name", "shape", "notes", "crossovers", "runs": [measure(...)],
                     "flop_curve": [{"T", part/group: share}, ...]}]}
    """
    seq_lens = [check_positive_int(T, "seq_lens") for T in seq_lens]
    if not seq_lens:
        raise AttnlabError("seq_lens: expected at least one sequence length, got none")
    grid = list(curve) if curve is not None else [2**k for k in range(4, 15)]
    dtypes = {str(m.layers[0].attn.Wq.dtype) for m in models.values() if m.layers}
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "settings": {
            "threads": threads, "repeats": repeats, "batch": batch, "seed": seed,
            "dtype": ", ".join(sorted(dtypes)), "seq_lens": seq_lens,
            "flop_convention": "matmul (m,k)·(k,n) = 2mkn; elementwise op or n-element "
                               "reduction = n (exp, erf, tanh count 1); mask select = 0",
        },
        "parts": {p: {"group": g, "description": d} for p, (g, d) in PARTS.items()},
        "groups": {g: list(members) for g, members in GROUPS.items()},
        "models": [],
    }
    with limit_threads(threads):
        for name, model in models.items():
            model_notes = list((notes or {}).get(name, ()))
            longest = max(seq_lens)
            P = model.config.max_position_embeddings
            if longest > P:
                model = with_max_positions(model, longest)
                model_notes.append(f"position table has {P} rows; for T > {P} it is tiled "
                                   f"(row p reads row p mod {P}): same cost, not a trained model")
            shape = ModelShape.of(model)
            runs = [measure(model, T, repeats=repeats, batch=batch, seed=seed,
                            compare_forward=compare_forward) for T in seq_lens]
            report["models"].append({
                "name": name, "shape": shape.as_dict(), "notes": model_notes,
                "crossovers": crossovers(shape), "runs": runs,
                "flop_curve": share_curve(shape, grid),
            })
    return report


# ---------------------------------------------------------------------- plot


def plot_shares(report: Mapping[str, Any]) -> Figure:
    """Share vs T, one panel per model: FLOP-share curves, measured time shares as dots."""
    from ..report.figures import new_figure
    models = report["models"]
    if not models:
        raise AttnlabError("report: expected at least one model, got none")
    fig = new_figure((5.5 * len(models) + 1.5, 5.0))
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    styles = {"attention": ("C3", "attention (with projections)"),
              "attention_core": ("C1", "attention core (QKᵀ, softmax, ·V)"),
              "feed_forward": ("C0", "feed-forward"), "rest": ("C7", "rest")}
    for ax, entry in zip(axes, models, strict=True):
        curve = entry["flop_curve"]
        Ts = [point["T"] for point in curve]
        for group, (colour, label) in styles.items():
            first = ax is axes[0]  # one legend entry per line style
            ax.plot(Ts, [point[group] for point in curve], color=colour,
                    label=f"{label}, FLOPs" if first else None)
            ax.plot([run["T"] for run in entry["runs"]],
                    [run["time_share"][group] for run in entry["runs"]], "o--", color=colour,
                    alpha=0.7, markersize=5, label=f"{label}, time" if first else None)
        ax.axhline(0.6, color="k", linestyle=":", linewidth=1)
        crossing = entry["crossovers"]["core_vs_ffn"]
        if crossing is not None:
            ax.axvline(crossing, color="C1", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("share of the forward pass")
        ax.set_title(entry["name"], fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle("lines: FLOP share (formula) · dots: measured share of wall time · "
                 "dotted: 60% and the T where QKᵀ+softmax+·V overtakes the FFN", fontsize=8)
    fig.legend(loc="outside lower center", ncol=4, fontsize=7)
    return fig
