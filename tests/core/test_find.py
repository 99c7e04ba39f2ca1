"""attnlab.lens.find on hand-built weights whose answers are known exactly."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.errors import AttnlabError
from attnlab.lens.find import find_heads, informative_head, parse_link

TOKENS = ["[CLS]", "the", "animal", "was", "tired", "it", "slept", "[SEP]"]


def uniform(L: int = 2, H: int = 3, T: int = len(TOKENS)) -> np.ndarray:
    return np.full((L, H, T, T), 1.0 / T)  # (L, H, T, T)


def test_find_heads_ranks_by_the_weight_from_source_to_target():
    w = uniform()
    for (layer, head), weight in {(1, 2): 0.7, (0, 1): 0.4, (1, 0): 0.2}.items():
        w[layer, head, 5] = (1 - weight) / 7
        w[layer, head, 5, 2] = weight  # "it" -> "animal"
    found = find_heads(w, TOKENS, "it", "animal", top=4)
    assert [(f.layer, f.head, f.query, f.key) for f in found] == [
        (1, 2, 5, 2), (0, 1, 5, 2), (1, 0, 5, 2), (0, 0, 5, 2)]
    assert [f.weight for f in found[:3]] == pytest.approx([0.7, 0.4, 0.2], abs=1e-15)
    assert found[3].weight == pytest.approx(1 / 8)  # ties: the lowest layer, then head


def test_repeated_tokens_count_every_pair_of_distinct_positions():
    tokens = ["[CLS]", "moon", "sky", "moon", "[SEP]"]
    w = np.full((1, 2, 5, 5), 0.2)
    w[0, 1, 3] = [0.1, 0.6, 0.1, 0.1, 0.1]  # the second "moon" looks at the first
    found = find_heads(w, tokens, "Moon", "moon", top=1)  # case-insensitive
    assert (found[0].head, found[0].query, found[0].key) == (1, 3, 1)
    assert found[0].weight == pytest.approx(0.6)


def test_word_pieces_match_without_their_hashes():
    tokens = ["[CLS]", "play", "##ing", "it", "[SEP]"]
    found = find_heads(np.full((1, 1, 5, 5), 0.2), tokens, "it", "ing")
    assert (found[0].query, found[0].key) == (3, 2)


def test_informative_head_ignores_special_tokens_and_self():
    w = uniform(1, 3)
    w[0, 0] = 0.0
    w[0, 0, :, -1] = 1.0  # a [SEP] sink: ordinary keys get nothing
    w[0, 1] = np.eye(len(TOKENS))  # every token looks at itself only
    w[0, 2] = 0.0
    w[0, 2, np.arange(1, 8), np.arange(0, 7)] = 1.0  # previous token
    w[0, 2, 0, 0] = 1.0
    assert informative_head(w, TOKENS) == (0, 2)


@pytest.mark.parametrize(("call", "pattern"), [
    (lambda: parse_link("it animal"), "expected two tokens joined by '->'"),
    (lambda: parse_link("->animal"), "expected two tokens joined by '->'"),
    (lambda: find_heads(uniform(), TOKENS, "dog", "animal"), "source: expected one of"),
    (lambda: find_heads(uniform(), TOKENS, "it", "cat"), "target: expected one of"),
    (lambda: find_heads(uniform(), TOKENS, "it", "it"), "two different positions"),
    (lambda: find_heads(uniform(), TOKENS[:3], "it", "the"), "tokens: expected 8 tokens"),
    (lambda: find_heads(uniform(), TOKENS, "it", "the", top=0), "top: expected an int"),
])
def test_bad_input_is_named(call, pattern):
    with pytest.raises(AttnlabError, match=pattern):
        call()


def test_parse_link_accepts_both_arrows():
    assert parse_link(" it -> animal ") == ("it", "animal")
    assert parse_link("月→月") == ("月", "月")
