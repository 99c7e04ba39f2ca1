"""Which heads matter for sentence similarity? Ablation, importance and head kinds on a
sentence-embedding model (all-MiniLM-L6-v2 by default).

Over the sentence pairs shipped with attnlab (``data/sentence_pairs.json``: English and
Chinese, paraphrases and a few unrelated pairs; every Chinese character is in
MiniLM's vocabulary, so none becomes [UNK]), for every head alone and every layer's
heads together:

``drift``
    the drop in cosine agreement with the unablated model: the mean over all
    sentences of ``1 − cos(e_ablated(s), e(s))`` (sentence embeddings, mean-pooled
    and normalised, as the model is used);
``similarity_change``
    the mean over pairs of ``|cos_ablated(a, b) − cos(a, b)|``: how much the
    similarity the model is used for moves.

Then ``importance`` (Michel et al. 2019: mean over the pairs of |∂ cos(a, b)/∂ξ|,
:func:`attnlab.lens.importance.head_importance`), the heads' kinds from the weights'
diagnostics (:func:`attnlab.lens.diagnostics.diagnose`: the share of sentences on
which a head is flagged sink, previous_token, next_token, self, near_uniform,
over_sparse), and Spearman rank correlations between the measures — also between
the English and the Chinese pairs' tables (``by_lang``): do the same heads matter?

Heads and layers are 0-based in the data (the CLI prints them from 1).

Dimension legend: L layers, H heads, P pairs, N sentences.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..lens.ablation import ablate
from ..lens.diagnostics import diagnose
from ..lens.importance import head_importance

__all__ = ["FLAGS", "FLOW_MAX_TOKENS", "HeadStudy", "TextLens", "analyse_text", "head_kinds",
           "is_chinese", "run_head_study", "sentence_pairs", "spearman"]

#: The diagnostics' flags a head can carry, in the order the tables show them.
FLAGS = ("sink", "previous_token", "next_token", "self", "near_uniform", "over_sparse")


def sentence_pairs(lang: str | None = None) -> list[tuple[str, str]]:
    """The shipped sentence pairs: ``lang`` "en", "zh" or None (both)."""
    if lang not in (None, "en", "zh"):
        raise AttnlabError(f"lang: expected 'en', 'zh' or None (both), got {lang!r}")
    text = resources.files("attnlab.studies").joinpath("data/sentence_pairs.json").read_text(
        encoding="utf-8")
    return [(p["a"], p["b"]) for p in json.loads(text) if lang is None or p["lang"] == lang]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two equally long arrays (ties get mean ranks)."""
    ra, rb = _ranks(np.ravel(a)), _ranks(np.ravel(b))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = float(np.sqrt((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator > 0 else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for value in np.unique(values):  # ties: the mean of their ranks
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def head_kinds(model: Any, texts: list[str]) -> dict[str, np.ndarray]:
    """Per flag of :data:`FLAGS`, the share of ``texts`` on which each head has it: (L, H)."""
    L, H = len(model.layers), model.layers[0].attn.num_heads
    counts = {flag: np.zeros((L, H)) for flag in FLAGS}
    for text in texts:
        weights, tokens = model.attentions(text)  # (L, H, T, T)
        report = diagnose(weights, tokens)
        for head in report.heads:
            for flag in head.flags:
                counts[flag][head.layer, head.head] += 1
    return {flag: count / max(len(texts), 1) for flag, count in counts.items()}


@dataclass
class HeadStudy:
    """The study's results (see the module doc); arrays are (L, H) or (L,)."""

    model: str
    pairs: list[tuple[str, str]]
    how: str
    similarity: np.ndarray  # (P,) cos(a, b) of the unablated model
    head_drift: np.ndarray  # (L, H)
    head_similarity_change: np.ndarray  # (L, H)
    layer_drift: np.ndarray  # (L,)
    layer_similarity_change: np.ndarray  # (L,)
    importance: np.ndarray  # (L, H)
    kinds: dict[str, np.ndarray]  # flag -> (L, H) share of sentences
    correlations: dict[str, float] = field(default_factory=dict)
    by_lang: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # en/zh (L, H)

    def ranking(self, measure: str = "head_drift", top: int = 5) -> list[tuple[int, int, float]]:
        """The ``top`` heads by a (L, H) measure, largest first: (layer, head, value)."""
        values = getattr(self, measure)
        order = np.argsort(-values, axis=None, kind="stable")[:top]
        return [(int(i // values.shape[1]), int(i % values.shape[1]),
                 float(values.flat[i])) for i in order]

    def kind_means(self, measure: str = "head_drift") -> dict[str, float | None]:
        """Mean of a measure over the heads that carry each flag on most sentences
        (share > 0.5), and over the heads that carry none ("none")."""
        values = getattr(self, measure)
        flagged = np.zeros(values.shape, dtype=bool)
        means: dict[str, float | None] = {}
        for flag in FLAGS:
            chosen = self.kinds[flag] > 0.5
            flagged |= chosen
            means[flag] = float(values[chosen].mean()) if chosen.any() else None
        means["none"] = float(values[~flagged].mean()) if (~flagged).any() else None
        return means

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "how": self.how, "pairs": [list(p) for p in self.pairs],
            "similarity": self.similarity.tolist(),
            "head_drift": self.head_drift.tolist(),
            "head_similarity_change": self.head_similarity_change.tolist(),
            "layer_drift": self.layer_drift.tolist(),
            "layer_similarity_change": self.layer_similarity_change.tolist(),
            "importance": self.importance.tolist(),
            "kinds": {flag: share.tolist() for flag, share in self.kinds.items()},
            "kind_means_drift": self.kind_means("head_drift"),
            "kind_means_importance": self.kind_means("importance"),
            "correlations": self.correlations,
            "by_lang": {lang: {name: table.tolist() for name, table in tables.items()}
                        for lang, tables in self.by_lang.items()},
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent)


def _measure(model: Any, sentences: list[str], index_a: np.ndarray, index_b: np.ndarray,
             full: np.ndarray, full_similarity: np.ndarray, heads: list[tuple[int, int]],
             how: str, means: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per sentence 1 − cos(ablated, full) (N,) and per pair |Δ cos(a, b)| (P,)."""
    with ablate(model, heads, how=how, reference=means):  # type: ignore[arg-type]
        emb = model.encode(sentences)  # (N, E)
    drift = 1.0 - np.sum(emb * full, axis=-1)  # (N,)
    similarity = np.sum(emb[index_a] * emb[index_b], axis=-1)  # (P,)
    return drift, np.abs(similarity - full_similarity)


def is_chinese(text: str) -> bool:
    """Whether ``text`` has a CJK ideograph (the study's test for a Chinese sentence)."""
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def run_head_study(model: Any, pairs: list[tuple[str, str]] | None = None, *,
                   how: str = "zero") -> HeadStudy:
    """Ablate every head and every layer over ``pairs`` (default: all shipped pairs)."""
    from ..lens.ablation import head_means

    pairs = sentence_pairs() if pairs is None else [tuple(p) for p in pairs]  # type: ignore[misc]
    if not pairs:
        raise AttnlabError("pairs: expected at least one (text, text) pair, got none")
    sentences = sorted({text for pair in pairs for text in pair})
    where = {text: i for i, text in enumerate(sentences)}
    index_a = np.array([where[a] for a, _ in pairs])
    index_b = np.array([where[b] for _, b in pairs])
    L, H = len(model.layers), model.layers[0].attn.num_heads
    means = head_means(model, sentences) if how == "mean" else None
    full = model.encode(sentences)  # (N, E)
    full_similarity = np.sum(full[index_a] * full[index_b], axis=-1)  # (P,)
    N, P = len(sentences), len(pairs)
    sentence_drift = np.zeros((L, H, N))  # (L, H, N)
    pair_change = np.zeros((L, H, P))  # (L, H, P)
    for layer in range(L):
        for head in range(H):
            sentence_drift[layer, head], pair_change[layer, head] = _measure(
                model, sentences, index_a, index_b, full, full_similarity, [(layer, head)],
                how, means)
    layer_drift, layer_change = np.zeros(L), np.zeros(L)
    for layer in range(L):
        drift, change = _measure(model, sentences, index_a, index_b, full, full_similarity,
                                 [(layer, head) for head in range(H)], how, means)
        layer_drift[layer], layer_change[layer] = drift.mean(), change.mean()
    chinese_pairs = np.array([is_chinese(a + b) for a, b in pairs])  # (P,)
    by_lang: dict[str, dict[str, np.ndarray]] = {}
    tables = []
    for lang, chosen in (("en", ~chinese_pairs), ("zh", chinese_pairs)):
        if chosen.any():
            chosen_pairs = [pair for pair, keep in zip(pairs, chosen, strict=True) if keep]
            table = head_importance(model, chosen_pairs)  # (L, H)
            tables.append(table * len(chosen_pairs))
            in_lang = np.array([is_chinese(t) == (lang == "zh") for t in sentences])  # (N,)
            by_lang[lang] = {"head_drift": sentence_drift[..., in_lang].mean(axis=-1),
                             "importance": table}
    importance = np.sum(tables, axis=0) / P  # (L, H): the mean over every pair
    head_drift = sentence_drift.mean(axis=-1)  # (L, H)
    head_change = pair_change.mean(axis=-1)  # (L, H)
    kinds = head_kinds(model, sentences)
    study = HeadStudy(getattr(model, "name", "model"), list(pairs), how, full_similarity,
                      head_drift, head_change, layer_drift, layer_change, importance, kinds,
                      by_lang=by_lang)
    study.correlations = {
        "importance~similarity_change": spearman(importance, head_change),
        "importance~drift": spearman(importance, head_drift),
        "drift~similarity_change": spearman(head_drift, head_change),
        "sink_share~drift": spearman(kinds["sink"], head_drift),
        "near_uniform_share~drift": spearman(kinds["near_uniform"], head_drift),
    }
    if len(by_lang) == 2:
        study.correlations["drift_en~drift_zh"] = spearman(by_lang["en"]["head_drift"],
                                                          by_lang["zh"]["head_drift"])
        study.correlations["importance_en~importance_zh"] = spearman(
            by_lang["en"]["importance"], by_lang["zh"]["importance"])
    return study


#: Attention flow runs T² max-flows; above this many tokens only rollout is computed.
FLOW_MAX_TOKENS = 24


@dataclass
class TextLens:
    """What ``attnlab lens TEXT [--pair OTHER]`` shows, as data.

    ``importance`` (L, H): |∂ cos(TEXT, OTHER)/∂ξ| with a pair, else the mean over the
    shipped pairs of TEXT's language (``importance_over`` says which). ``drift`` (L, H) and
    ``layer_drift`` (L,): 1 − cos(e_ablated(TEXT), e(TEXT)) per head / per layer.
    With a pair, ``similarity`` = cos(TEXT, OTHER) and ``similarity_change`` (L, H),
    ``layer_similarity_change`` (L,): cos_ablated − cos (signed). ``rollout`` and
    ``flow`` (T, T) over TEXT's tokens (flow None above :data:`FLOW_MAX_TOKENS`).
    """

    text: str
    pair: str | None
    tokens: list[str]
    importance: np.ndarray
    importance_over: str
    rollout: np.ndarray
    flow: np.ndarray | None
    drift: np.ndarray
    layer_drift: np.ndarray
    similarity: float | None = None
    similarity_change: np.ndarray | None = None
    layer_similarity_change: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        def plain(value: Any) -> Any:
            return value.tolist() if isinstance(value, np.ndarray) else value

        return {name: plain(getattr(self, name)) for name in (
            "text", "pair", "tokens", "importance", "importance_over", "rollout", "flow",
            "drift", "layer_drift", "similarity", "similarity_change",
            "layer_similarity_change")}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent)


def analyse_text(model: Any, text: str, pair: str | None = None, *,
                 how: str = "zero") -> TextLens:
    """Importance, ablation, rollout and flow for one text (and its pair)."""
    from ..lens.ablation import head_means
    from ..lens.rollout import attention_flow, attention_rollout

    texts = [text] if pair is None else [text, pair]
    L, H = len(model.layers), model.layers[0].attn.num_heads
    means = head_means(model, texts) if how == "mean" else None
    full = model.encode(texts)  # (1 or 2, E)

    def measure(heads: list[tuple[int, int]]) -> tuple[float, float | None]:
        with ablate(model, heads, how=how, reference=means):  # type: ignore[arg-type]
            emb = model.encode(texts)
        drift = float(1.0 - emb[0] @ full[0])
        change = None if pair is None else float(emb[0] @ emb[1] - full[0] @ full[1])
        return drift, change

    drift, change = np.zeros((L, H)), np.zeros((L, H))
    for layer in range(L):
        for head in range(H):
            drift[layer, head], value = measure([(layer, head)])
            change[layer, head] = np.nan if value is None else value
    layer_drift, layer_change = np.zeros(L), np.zeros(L)
    for layer in range(L):
        layer_drift[layer], value = measure([(layer, head) for head in range(H)])
        layer_change[layer] = np.nan if value is None else value
    if pair is None:  # the shipped pairs in TEXT's language: Chinese if it has CJK characters
        lang = "zh" if is_chinese(text) else "en"
        importance = head_importance(model, sentence_pairs(lang))
        over = f"the shipped {lang} sentence pairs"
    else:
        importance, over = head_importance(model, [(text, pair)]), "the pair"
    weights, tokens = model.attentions(text)  # (L, H, T, T)
    rollout = attention_rollout(weights)
    flow = attention_flow(weights) if len(tokens) <= FLOW_MAX_TOKENS else None
    return TextLens(text, pair, tokens, importance, over, rollout, flow, drift, layer_drift,
                    None if pair is None else float(full[0] @ full[1]),
                    None if pair is None else change,
                    None if pair is None else layer_change)
