"""Which heads link one token to another, and which head is worth looking at first.

Seed 001 says heads learn relations such as coreference. :func:`find_heads` asks
every head of a model at once: for the query token ``source`` and the key token
``target``, the weight each head puts from one on the other, largest first. On
all-MiniLM-L6-v2 and "The animal didn't cross the street because it was too tired."
(the sentence of Google's 2017 Transformer blog post and Jay Alammar's Illustrated
Transformer), layer 4 head 2 (counted from 1) puts 0.68 of "it"'s attention on
"animal". A weight is not a reading of the sentence: with "too wide" (where "it" is the
street) that head still puts 0.28 on "animal" (0.12 on "street") and layer 6 head 12
0.56: they link "it" to the subject noun, so compare such pairs before calling a head
a coreference head.

:func:`informative_head` picks the head a learner should see first: the one whose
queries, leaving out [CLS], [SEP] and the token itself, look hardest at one other
token (the largest mean row maximum over those keys). Near-uniform heads and heads
that only park their weight on [SEP] (most of a BERT's) score low.

Dimension legend: L layers, H heads, T query length, S key length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..messages import msg
from .weight_checks import check_weights

__all__ = ["HeadLink", "find_heads", "informative_head", "parse_link"]

SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "[PAD]", "<s>", "</s>", "<pad>"})


@dataclass(frozen=True)
class HeadLink:
    """One head's weight from a query token to a key token (0-based numbers)."""

    layer: int
    head: int
    query: int  # position of the source token
    key: int  # position of the target token
    weight: float


def parse_link(text: str, name: str = "link") -> tuple[str, str]:
    """``"it->animal"`` (or ``"it→animal"``) -> ("it", "animal"); ``name`` is the argument
    an error names."""
    if not isinstance(text, str):
        raise AttnlabError(msg("lens.link_type", name=name, type=type(text).__name__))
    for arrow in ("->", "→"):
        if arrow in text:
            source, _, target = text.partition(arrow)
            if source.strip() and target.strip():
                return source.strip(), target.strip()
    raise AttnlabError(msg("lens.link", name=name, got=repr(text)))


def _positions(tokens: Sequence[str], word: str, name: str) -> list[int]:
    wanted = word.lower()
    found = [i for i, token in enumerate(tokens) if token.lower().removeprefix("##") == wanted]
    if not found:
        shown = " ".join(tokens[:40]) + (" …" if len(tokens) > 40 else "")
        raise AttnlabError(msg("lens.not_a_token", name=name, got=repr(word), tokens=shown))
    return found


def find_heads(
    weights: Any, tokens: Sequence[str], source: str, target: str, *, top: int = 5
) -> list[HeadLink]:
    """The ``top`` heads putting the most weight from ``source`` onto ``target``.

    Args:
        weights: (L, H, T, T) attention weights of one text (or (H, T, T)).
        tokens: the T tokens.
        source, target: token texts (case-insensitive; a word piece's ``##`` ignored).
            Where either occurs several times, every pair of distinct positions counts
            and each head reports its strongest.
        top: how many heads to return, strongest first.

    Returns:
        ``top`` :class:`HeadLink` records, largest weight first (ties: lower layer, then
        lower head, first).
    """
    w = check_weights(weights)  # (L, H, T, S)
    L, H, T, S = w.shape
    if len(tokens) != T or S != T:
        raise AttnlabError(f"tokens: expected {T} tokens of a self-attention (T = S), got "
                           f"{len(tokens)} tokens for weights (T, S) = ({T}, {S})")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise AttnlabError(f"top: expected an int >= 1, got {top!r}")
    queries = _positions(tokens, source, "source")
    keys = _positions(tokens, target, "target")
    pairs = [(q, k) for q in queries for k in keys if q != k]
    if not pairs:
        raise AttnlabError(f"source, target: expected two different positions, got the "
                           f"single token {source!r} at {queries[0]}")
    q_index = np.array([q for q, _ in pairs])
    k_index = np.array([k for _, k in pairs])
    links = w[:, :, q_index, k_index]  # (L, H, pairs)
    best = links.argmax(axis=-1)  # (L, H)
    strongest = np.take_along_axis(links, best[..., None], axis=-1)[..., 0]  # (L, H)
    order = np.lexsort((np.arange(L * H), -strongest.ravel()))[:top]
    return [HeadLink(layer=int(i // H), head=int(i % H),
                     query=int(q_index[best.flat[i]]), key=int(k_index[best.flat[i]]),
                     weight=float(strongest.flat[i])) for i in order]


def informative_head(weights: Any, tokens: Sequence[str]) -> tuple[int, int]:
    """(layer, head), 0-based: the head looking hardest at one other ordinary token.

    Score of a head: the mean over ordinary query rows (not [CLS]/[SEP]/padding) of the
    largest weight on an ordinary key other than the query itself. Falls back to
    (0, 0) when the text has fewer than two ordinary tokens.
    """
    w = check_weights(weights)  # (L, H, T, S)
    L, H, T, S = w.shape
    if len(tokens) != T or S != T:
        raise AttnlabError(f"tokens: expected {T} tokens of a self-attention (T = S), got "
                           f"{len(tokens)} tokens for weights (T, S) = ({T}, {S})")
    ordinary = np.array([t not in SPECIAL_TOKENS for t in tokens])
    if ordinary.sum() < 2:
        return 0, 0
    keep = w[:, :, ordinary][:, :, :, ordinary]  # (L, H, n, n)
    n = keep.shape[-1]
    keep = np.where(np.eye(n, dtype=bool), 0.0, keep)  # not the token itself
    score = keep.max(axis=-1).mean(axis=-1)  # (L, H)
    layer, head = divmod(int(np.argmax(score)), H)
    return layer, head
