"""FLOPs of a BERT encoder, part by part, and where the balance between the parts tips.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import check_positive_int
from ..errors import AttnlabError
from ..models import BertConfig, BertModel

__all__ = [
    "PARTS", "GROUPS", "SOFTMAX_OPS", "ACTIVATION_OPS", "LAYERNORM_OPS", "ModelShape",
    "flop_polynomials", "flop_counts", "group_totals", "shares", "crossovers", "share_curve",
]

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
#: Elementwise operations per element of each activation (erf / tanh count one), by
#: attnlab's name and by the Hugging Face ``hidden_act`` names of a BERT config.
ACTIVATION_OPS = {"gelu": 5, "gelu_tanh": 9, "relu": 1, "gelu_new": 9, "gelu_pytorch_tanh": 9}
#: LayerNorm: 7 per element (mean, subtract, square, mean, divide, ·γ, +β), 4 per row.
LAYERNORM_OPS = (7, 4)


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
        """The shape of a :class:`BertModel` (its blocks' activation), or of a config."""
        config = model.config if isinstance(model, BertModel) else model
        activation = config.hidden_act
        if isinstance(model, BertModel) and model.layers:
            activation = model.layers[0].ffn.activation  # what the blocks really compute
        return cls(layers=config.num_hidden_layers, width=config.hidden_size,
                   heads=config.num_attention_heads, ffn=config.intermediate_size,
                   activation=activation)

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


def group_totals(parts: Mapping[str, float],
                 groups: Mapping[str, Sequence[str]] = GROUPS) -> dict[str, float]:
    """Sum the parts into ``groups`` (default :data:`GROUPS`), plus "total" of all parts."""
    totals = {group: float(sum(parts[p] for p in members)) for group, members in groups.items()}
    totals["total"] = float(sum(parts.values()))
    return totals


def shares(parts: Mapping[str, float],
           groups: Mapping[str, Sequence[str]] = GROUPS) -> dict[str, float]:
    """Fraction of the total of every part and every group (default :data:`GROUPS`)."""
    totals = group_totals(parts, groups)
    total = totals.pop("total")
    out = {name: float(value) / total for name, value in parts.items()}
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
