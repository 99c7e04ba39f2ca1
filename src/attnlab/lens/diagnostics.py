"""Attention diagnostics: seed 001's debugging checklist, made measurable.

Seed 001 says a healthy attention layer has weights that are *neither uniform nor
over-sparse* and heads that learn *different* patterns. :func:`diagnose` turns that
into numbers for any weights tensor ``(L, H, T, S)`` (L layers, H heads, T query
length, S key length; ``(H, T, S)`` is read as one layer), whatever produced it:
:func:`attnlab.lens.explain`, a pretrained model, or another library's
``output_attentions``.

Per head (every number is a mean over the head's counted query rows):

``entropy``
    normalised entropy of a row, ``-Σ_j p_j log p_j / log n``, where ``n`` is the
    number of keys the row may attend to. 1 = uniform over those keys, 0 = one-hot.
    Rows with fewer than two attendable keys carry no information about spread and
    are left out of this mean.
``max_weight``
    the largest weight of a row.
``special_share``
    the weight on [CLS]/[SEP] keys (``special_indices``, or the keys whose token is
    one of :data:`SPECIAL_TOKENS`).
``previous_token``, ``next_token``, ``self_token``
    the weight that query ``i`` puts on key ``i - 1``, ``i + 1`` and ``i``
    (self-attention only, T == S; neighbours are counted among real tokens, so left
    padding does not break them).

Flags and their thresholds (module constants, so they are documented in one place):

- ``near_uniform``: ``entropy > NEAR_UNIFORM_ENTROPY`` (0.9). Over 8 keys a row that
  gives 40 % to one key and spreads the rest evenly already scores 0.885; above 0.9
  no key stands out, the head averages its inputs (seed 001: often a sign that the
  scores are too small, e.g. a missing or doubled 1/√d_k, or untrained weights).
- ``over_sparse``: ``max_weight > OVER_SPARSE_MAX_WEIGHT`` (0.9) or
  ``entropy < OVER_SPARSE_ENTROPY`` (0.1). Over 8 keys, 97 % on one key scores 0.093.
  Such rows are a hard lookup: the softmax is saturated and passes almost no gradient
  to the other keys (seed 001: scores too large, e.g. no 1/√d_k). Trained models do
  have deliberate one-hot heads (previous-token, [SEP] sinks), so this is a flag to
  look at, not an error.
- ``sink``: ``special_share > SINK_SHARE`` (0.5) *and* at least ``SINK_CHANCE_RATIO``
  (1.5) times the share a uniform row would give the same keys. More than half the
  attention parked on [CLS]/[SEP] is the "no-op" pattern Clark et al. (2019) found in
  BERT. The chance condition only matters for very short inputs (with two special
  tokens and six or more keys it follows from the first): it keeps a uniform head
  over ``[CLS] x [SEP]`` (2/3 on special keys by chance) from being called a sink.
- ``previous_token`` / ``next_token`` / ``self``: the score is above
  ``POSITIONAL_HEAD_SCORE`` (0.5): most of the head's attention goes to that position.

Per layer, head diversity is the Jensen–Shannon distance between two heads: for each
query row, ``sqrt(JSD(p, q))`` with base-2 logarithms (so it lies in [0, 1]: 0 for
identical rows, 1 for rows on disjoint keys), averaged over the rows both heads count.
Pairs closer than ``NEAR_DUPLICATE_JS`` (0.1, about what moving 10 % of a row's mass
to another key gives) are flagged as near-duplicates: one of the two heads is
probably redundant.

Which rows and keys count
-------------------------
Masks follow attnlab's one convention: bool, **True = may attend / is a real token**.
A key may be attended to when ``key_padding`` (S,) and ``mask`` (broadcastable to
(T, S)) both allow it; pass ``mask=attnlab.causal_mask(T)`` for a decoder, otherwise
every row is normalised by ``log S``. A query row counts when ``query_padding`` (T,)
allows it (for self-attention it defaults to ``key_padding``), it has an attendable
key, and its weights are not all zero (attnlab gives a fully masked row zeros).
Weight on keys that may not be attended to must be ~0 (at most ``WEIGHT_TOL``): more
means the mask given here is not the mask the model used, and is reported as an error
rather than silently ignored.

Layers and heads are 0-based in :meth:`Diagnostics.to_dict`; the printed table
(:func:`attnlab.report.diagnostics_table`, in English or Chinese) numbers them from 1.

>>> import numpy as np
>>> report = diagnose(np.full((1, 2, 3, 3), 1 / 3), ["[CLS]", "hi", "[SEP]"])
>>> round(report.head(0, 0).entropy, 6), report.head(0, 0).flags
(1.0, ['near_uniform'])
>>> report.layers[0].near_duplicates
[(0, 1, 0.0)]
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AttnlabError
from .weight_checks import (
    WEIGHT_TOL,
    check_labels,
    check_mask,
    check_padding,
    check_rows,
    check_specials,
    check_weights,
)

if TYPE_CHECKING:
    from ..trace import Trace

__all__ = [
    "NEAR_UNIFORM_ENTROPY",
    "OVER_SPARSE_MAX_WEIGHT",
    "OVER_SPARSE_ENTROPY",
    "SINK_SHARE",
    "SINK_CHANCE_RATIO",
    "POSITIONAL_HEAD_SCORE",
    "NEAR_DUPLICATE_JS",
    "WEIGHT_TOL",
    "SPECIAL_TOKENS",
    "HeadDiagnostics",
    "LayerDiagnostics",
    "Diagnostics",
    "diagnose",
    "diagnose_trace",
    "trace_weights",
]

NEAR_UNIFORM_ENTROPY = 0.9
"""A head is near uniform when its mean normalised row entropy is above this."""
OVER_SPARSE_MAX_WEIGHT = 0.9
"""A head is over-sparse when its mean row maximum is above this ..."""
OVER_SPARSE_ENTROPY = 0.1
"""... or its mean normalised row entropy is below this."""
SINK_SHARE = 0.5
"""A sink head puts more than this share of its attention on [CLS]/[SEP] ..."""
SINK_CHANCE_RATIO = 1.5
"""... and at least this many times what a uniform row would put there."""
POSITIONAL_HEAD_SCORE = 0.5
"""A previous-token / next-token / self head scores above this."""
NEAR_DUPLICATE_JS = 0.1
"""Two heads of a layer are near-duplicates below this Jensen–Shannon distance."""
SPECIAL_TOKENS = ("[CLS]", "[SEP]")
"""Tokens whose keys count as attention sinks when ``special_indices`` is not given."""

@dataclass(frozen=True)
class HeadDiagnostics:
    """The checklist for one head. ``None`` = not defined for this input (see module doc)."""

    layer: int
    head: int
    rows: int  # query rows counted
    entropy: float | None  # mean normalised row entropy, in [0, 1]
    max_weight: float | None  # mean row maximum
    special_share: float | None  # mean weight on [CLS]/[SEP] keys
    previous_token: float | None  # mean weight of query i on key i-1
    next_token: float | None  # ... on key i+1
    self_token: float | None  # ... on key i
    near_uniform: bool
    over_sparse: bool
    sink: bool

    @property
    def flags(self) -> list[str]:
        """Names of the raised flags, in a fixed order (keys of the table's legend)."""
        scores = {"previous_token": self.previous_token, "next_token": self.next_token,
                  "self": self.self_token}
        raised = [name for name, on in (("near_uniform", self.near_uniform),
                                        ("over_sparse", self.over_sparse),
                                        ("sink", self.sink)) if on]
        raised += [name for name, score in scores.items()
                   if score is not None and score > POSITIONAL_HEAD_SCORE]
        return raised

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flags": self.flags}


@dataclass(frozen=True, eq=False)
class LayerDiagnostics:
    """Head diversity of one layer: pairwise Jensen–Shannon distances (base 2).

    It holds an array, so ``==`` is identity; compare :meth:`to_dict` results instead.
    """

    layer: int
    js_distance: np.ndarray = field(repr=False)  # (H, H); NaN where two heads share no row
    mean_js_distance: float | None  # over pairs of distinct heads; None when H = 1
    closest_pair: tuple[int, int, float] | None  # (head a, head b, distance)
    near_duplicates: list[tuple[int, int, float]]  # pairs below NEAR_DUPLICATE_JS

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "js_distance": [[_num(x) for x in row] for row in self.js_distance],
            "mean_js_distance": self.mean_js_distance,
            "closest_pair": None if self.closest_pair is None else list(self.closest_pair),
            "near_duplicates": [list(pair) for pair in self.near_duplicates],
        }


@dataclass(frozen=True, eq=False)
class Diagnostics:
    """Result of :func:`diagnose`: one record per head (layer-major) and per layer.

    ``==`` is identity (the layers hold arrays); compare :meth:`to_dict` results instead.
    """

    shape: tuple[int, int, int, int]  # (L, H, T, S)
    heads: list[HeadDiagnostics]
    layers: list[LayerDiagnostics]
    tokens: list[str] | None = None
    key_tokens: list[str] | None = None
    special_indices: list[int] = field(default_factory=list)

    def head(self, layer: int, head: int) -> HeadDiagnostics:
        """The record of ``head`` in ``layer`` (0-based)."""
        L, H = self.shape[:2]
        if not (0 <= layer < L and 0 <= head < H):
            raise AttnlabError(
                f"layer, head: expected 0 <= layer < {L} and 0 <= head < {H}, "
                f"got layer={layer}, head={head}"
            )
        return self.heads[layer * H + head]

    @staticmethod
    def thresholds() -> dict[str, float]:
        return {
            "near_uniform_entropy": NEAR_UNIFORM_ENTROPY,
            "over_sparse_max_weight": OVER_SPARSE_MAX_WEIGHT,
            "over_sparse_entropy": OVER_SPARSE_ENTROPY,
            "sink_share": SINK_SHARE,
            "sink_chance_ratio": SINK_CHANCE_RATIO,
            "positional_head_score": POSITIONAL_HEAD_SCORE,
            "near_duplicate_js": NEAR_DUPLICATE_JS,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": dict(zip(("L", "H", "T", "S"), self.shape, strict=True)),
            "tokens": self.tokens,
            "key_tokens": self.key_tokens,
            "special_indices": self.special_indices,
            "thresholds": self.thresholds(),
            "heads": [h.to_dict() for h in self.heads],
            "layers": [layer.to_dict() for layer in self.layers],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent, allow_nan=False)


# ---------------------------------------------------------------------------- API


def diagnose(
    weights: Any,
    tokens: Sequence[str] | None = None,
    *,
    key_tokens: Sequence[str] | None = None,
    key_padding: Any = None,
    query_padding: Any = None,
    valid_length: int | None = None,
    mask: Any = None,
    special_indices: Sequence[int] | None = None,
) -> Diagnostics:
    """Measure every head and layer of ``weights``; see the module doc for the definitions.

    Args:
        weights: (L, H, T, S) attention weights (rows sum to 1), or (H, T, S) for L = 1.
        tokens: T query labels; also the key labels when S == T and no ``key_tokens``.
        key_tokens: S key labels (cross-attention).
        key_padding: bool (S,); True = a real token (may be attended to).
        query_padding: bool (T,); True = a real query row. Defaults to ``key_padding``
            when T == S, else all True.
        valid_length: shorthand for right padding: the first ``valid_length`` keys (and,
            when T == S, queries) are real. Not together with the two above.
        mask: bool, broadcastable to (T, S); True = may attend (e.g. ``causal_mask(T)``).
        special_indices: key indices of [CLS]/[SEP]-like tokens; by default the keys whose
            label is in :data:`SPECIAL_TOKENS`.

    Returns:
        :class:`Diagnostics` with L*H head records and L layer records.
    """
    w = check_weights(weights)  # (L, H, T, S)
    L, H, T, S = w.shape
    tokens_list = check_labels(tokens, "tokens", T, "T")
    keys_list = check_labels(key_tokens, "key_tokens", S, "S")
    if keys_list is None and tokens_list is not None and S == T:
        keys_list = tokens_list
    key_valid, query_valid = check_padding(key_padding, query_padding, valid_length, T, S)
    allowed = np.ones((T, S), dtype=bool) if mask is None else check_mask(mask, T, S)
    allowed = allowed & key_valid[None, :]  # (T, S)
    specials = check_specials(special_indices, keys_list, S, SPECIAL_TOKENS)

    n_allowed = allowed.sum(axis=1)  # (T,)
    row_sums = w.sum(axis=-1)  # (L, H, T)
    candidate = query_valid & (n_allowed >= 1)  # (T,): real rows that can attend somewhere
    check_rows(w, row_sums, candidate, allowed)
    counted = candidate & (row_sums > WEIGHT_TOL)  # (L, H, T): not a fully masked zero row
    probs = np.where(allowed, np.clip(w, 0.0, None), 0.0)  # (L, H, T, S)

    # Entropy, normalised by log(number of attendable keys); only rows with >= 2 keys.
    plogp = probs * np.log(np.where(probs > 0, probs, 1.0))  # (L, H, T, S)
    log_n = np.log(np.maximum(n_allowed, 2))  # (T,)
    entropy_rows = -plogp.sum(axis=-1) / log_n  # (L, H, T)
    entropy = _masked_mean(entropy_rows, counted & (n_allowed >= 2))  # (L, H)
    max_weight = _masked_mean(probs.max(axis=-1), counted)  # (L, H)

    special_share: np.ndarray | None = None  # (L, H)
    chance: np.ndarray | None = None  # (L, H): the share a uniform row would give
    if specials:
        special_keys = np.zeros(S, dtype=bool)
        special_keys[specials] = True
        special_rows = probs[..., special_keys].sum(axis=-1)  # (L, H, T)
        chance_rows = (allowed & special_keys).sum(axis=1) / np.maximum(n_allowed, 1)  # (T,)
        special_share = _masked_mean(special_rows, counted)  # (L, H)
        chance = _masked_mean(np.broadcast_to(chance_rows, counted.shape), counted)  # (L, H)

    positional = None  # positions only line up in self-attention
    if T == S:
        positional = _positional_scores(probs, counted, allowed, query_valid & key_valid)

    heads = []
    for layer in range(L):
        for head in range(H):
            ent, top = _opt(entropy[layer, head]), _opt(max_weight[layer, head])
            share = None if special_share is None else _opt(special_share[layer, head])
            base = None if chance is None else _opt(chance[layer, head])
            prev, nxt, own = (None, None, None) if positional is None else (
                _opt(positional[0][layer, head]), _opt(positional[1][layer, head]),
                _opt(positional[2][layer, head]))
            heads.append(HeadDiagnostics(
                layer=layer, head=head, rows=int(counted[layer, head].sum()),
                entropy=ent, max_weight=top, special_share=share,
                previous_token=prev, next_token=nxt, self_token=own,
                near_uniform=ent is not None and ent > NEAR_UNIFORM_ENTROPY,
                over_sparse=(top is not None and top > OVER_SPARSE_MAX_WEIGHT)
                or (ent is not None and ent < OVER_SPARSE_ENTROPY),
                sink=share is not None and base is not None and share > SINK_SHARE
                and share >= SINK_CHANCE_RATIO * base,
            ))
    layers = [_layer_diversity(layer, probs[layer], counted[layer]) for layer in range(L)]
    return Diagnostics(shape=(L, H, T, S), heads=heads, layers=layers, tokens=tokens_list,
                       key_tokens=keys_list, special_indices=specials)


def trace_weights(trace: Trace) -> np.ndarray:
    """The attention weights of a :class:`attnlab.Trace` as one (L, H, T, S) array.

    Steps without a layer tag form a single layer; a trace of one head gives H = 1.
    """
    return trace.attention()  # (L, H, T, S)


def diagnose_trace(trace: Trace, **options: Any) -> Diagnostics:
    """:func:`diagnose` on a trace's weights, labelled with its tokens."""
    options.setdefault("key_tokens", trace.key_tokens)
    return diagnose(trace_weights(trace), trace.tokens, **options)


# ---------------------------------------------------------------------- internals


def _masked_mean(values: np.ndarray, include: np.ndarray) -> np.ndarray:
    """Mean over the last axis of ``values`` where ``include``; NaN where nothing counts."""
    include = np.broadcast_to(include, values.shape)
    count = include.sum(axis=-1)
    total = np.where(include, values, 0.0).sum(axis=-1)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def _positional_scores(
    probs: np.ndarray, counted: np.ndarray, allowed: np.ndarray, real: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(previous, next, self) scores, (L, H) each; neighbours are taken among real tokens."""
    order = np.flatnonzero(real)  # positions of real tokens, in order
    scores = []
    for queries, keys in ((order[1:], order[:-1]), (order[:-1], order[1:]), (order, order)):
        usable = allowed[queries, keys]  # a masked neighbour cannot be attended: skip it
        queries, keys = queries[usable], keys[usable]
        picked = probs[:, :, queries, keys]  # (L, H, n)
        scores.append(_masked_mean(picked, counted[:, :, queries]))
    return scores[0], scores[1], scores[2]


def _js_distance(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise Jensen–Shannon distance, base 2: sqrt of the divergence, in [0, 1]."""
    m = 0.5 * (p + q)  # (T, S)
    safe_m = np.where(m > 0, m, 1.0)

    def kl(a: np.ndarray) -> np.ndarray:
        return (a * np.log2(np.where(a > 0, a, 1.0) / safe_m)).sum(axis=-1)  # (T,)

    divergence = 0.5 * kl(p) + 0.5 * kl(q)
    return np.sqrt(np.clip(divergence, 0.0, 1.0))


def _layer_diversity(layer: int, probs: np.ndarray, counted: np.ndarray) -> LayerDiagnostics:
    H = probs.shape[0]
    distance = np.zeros((H, H))  # (H, H)
    pairs = []
    for a in range(H):
        for b in range(a + 1, H):
            both = counted[a] & counted[b]  # (T,)
            value = float(_js_distance(probs[a, both], probs[b, both]).mean()) \
                if both.any() else math.nan
            distance[a, b] = distance[b, a] = value
            if not math.isnan(value):
                pairs.append((a, b, value))
    closest = min(pairs, key=lambda pair: pair[2]) if pairs else None
    return LayerDiagnostics(
        layer=layer,
        js_distance=distance,
        mean_js_distance=float(np.mean([d for _, _, d in pairs])) if pairs else None,
        closest_pair=closest,
        near_duplicates=[pair for pair in pairs if pair[2] < NEAR_DUPLICATE_JS],
    )


def _opt(value: Any) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)
