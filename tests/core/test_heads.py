"""Head detectors (TransformerLens's "mul" score) on hand-built patterns whose scores are
known exactly: the expected values are worked out by hand in the comments, not by the code."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.errors import AttnlabError, ShapeError
from attnlab.lens.heads import (
    all_head_scores,
    duplicate_token_pattern,
    head_scores,
    induction_pattern,
    previous_token_pattern,
)

# Exact-by-construction weights: sums of a few dyadic fractions, so every score below is a
# ratio of small exact binary numbers; the tolerance 1e-12 only allows for summation order.
TOL = 1e-12


def test_patterns_by_hand():
    assert previous_token_pattern(3).tolist() == [[0, 0, 0], [1, 0, 0], [0, 1, 0]]
    # tokens a b a b: query 2 (a) has an earlier a at 0; query 3 (b) has one at 1
    dup = duplicate_token_pattern(["a", "b", "a", "b"])
    assert dup.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]]
    # induction: the key after the earlier copy: query 2 -> key 1, query 3 -> key 2
    ind = induction_pattern([7, 8, 7, 8])
    assert ind.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    # a token repeated right away: the shifted pattern reaches the diagonal (TL's tril keeps it)
    assert induction_pattern([4, 4]).tolist() == [[0, 0], [0, 1]]


def _repeated(period):
    """BOS x x with x = 0 .. period-1 (no accidental repeats): T = 2 * period + 1."""
    return [99, *range(period), *range(period)]


def test_a_perfect_induction_head_scores_one_and_others_score_what_they_share():
    tokens = _repeated(3)  # BOS 0 1 2 0 1 2, T = 7; induction stripe j = i - 2 for i >= 4
    T = len(tokens)
    induction = np.zeros((T, T))
    induction[:4, 0] = 1.0  # the first half attends to BOS (not part of the pattern)
    for i in range(4, T):
        induction[i, i - 2] = 1.0
    previous = np.eye(T, k=-1)
    previous[0, 0] = 1.0
    w = np.stack([induction, previous])[None]  # (1, 2, 7, 7)
    scores = all_head_scores(w, tokens)
    # induction head: 3 of its 7 units of attention are on the stripe
    assert scores["induction"][0, 0] == pytest.approx(3 / 7, abs=TOL)
    # without BOS, all that is left is the stripe
    no_bos = head_scores(w, tokens, "induction", exclude_bos=True)
    assert no_bos[0, 0] == pytest.approx(1.0, abs=TOL)
    # previous-token head: 6 of 7 rows on i - 1; it shares nothing with the induction stripe
    assert scores["previous_token"][0, 1] == pytest.approx(6 / 7, abs=TOL)
    assert scores["induction"][0, 1] == pytest.approx(0.0, abs=TOL)
    # the induction stripe is one key after the duplicate: the duplicate score is 0 for both
    assert scores["duplicate_token"].tolist() == [[0.0, 0.0]]


def test_half_weights_and_exclusions():
    tokens = [5, 6, 5, 6]  # duplicates: (2, 0), (3, 1); induction: (2, 1), (3, 2)
    w = np.zeros((4, 4))
    w[0, 0] = 1.0
    w[1] = [0.5, 0.5, 0, 0]
    w[2] = [0.25, 0.25, 0.5, 0]  # 0.25 on the duplicate (2, 0), 0.25 on induction (2, 1)
    w[3] = [0, 0.5, 0.25, 0.25]  # 0.5 on the duplicate (3, 1), 0.25 on induction (3, 2)
    w = w[None, None]
    # duplicate: (0.25 + 0.5) / 4
    assert head_scores(w, tokens, "duplicate_token")[0, 0] == pytest.approx(0.1875, abs=TOL)
    # exclude BOS: column 0 loses 1 + 0.5 + 0.25 = 1.75 and the duplicate (2, 0) with it
    assert head_scores(w, tokens, "duplicate_token", exclude_bos=True)[0, 0] == \
        pytest.approx(0.5 / 2.25, abs=TOL)
    # exclude the current token: the diagonal loses 1 + 0.5 + 0.5 + 0.25 = 2.25
    assert head_scores(w, tokens, "induction", exclude_current_token=True)[0, 0] == \
        pytest.approx(0.5 / 1.75, abs=TOL)
    # previous token: (1, 0) 0.5 + (2, 1) 0.25 + (3, 2) 0.25 = 1 of 4
    assert head_scores(w, tokens, "previous_token")[0, 0] == pytest.approx(0.25, abs=TOL)


def test_a_batch_is_the_mean_of_its_sequences():
    tokens = np.array([[1, 2, 1], [3, 3, 4]])
    first = np.array([[1, 0, 0], [1, 0, 0], [1, 0, 0]])  # duplicate (2, 0): 1 of 3
    second = np.array([[1, 0, 0], [1, 0, 0], [0, 0, 1]])  # duplicate (1, 0): 1 of 3
    w = np.stack([first, second])[:, None, None]  # (2, 1, 1, 3, 3)
    assert head_scores(w, tokens, "duplicate_token")[0, 0] == pytest.approx(1 / 3, abs=TOL)
    # induction: seq 0 pattern (2, 1) gets 0; seq 1 pattern (1, 1) gets 0 -> mean 0
    assert head_scores(w, tokens, "induction")[0, 0] == pytest.approx(0.0, abs=TOL)


def test_a_head_with_all_its_attention_excluded_scores_zero():
    w = np.zeros((1, 1, 3, 3))
    w[..., 0] = 1.0
    assert head_scores(w, [1, 2, 3], "previous_token", exclude_bos=True).tolist() == [[0.0]]


def test_bad_input_is_named():
    with pytest.raises(AttnlabError, match="detector: expected one of"):
        head_scores(np.ones((1, 1, 2, 2)) / 2, [1, 2], "copying")
    with pytest.raises(ShapeError, match=r"weights: expected \(L, H, T, T\)"):
        head_scores(np.ones((1, 1, 2, 3)) / 3, [1, 2], "induction")
    with pytest.raises(ShapeError, match="tokens: expected T = 2"):
        head_scores(np.ones((1, 1, 2, 2)) / 2, [1, 2, 3], "induction")
    with pytest.raises(ShapeError, match="T >= 2"):
        head_scores(np.ones((1, 1, 1, 1)), [1], "induction")
    with pytest.raises(AttnlabError, match="weights: expected attention weights >= 0"):
        head_scores(-np.ones((1, 1, 2, 2)), [1, 2], "induction")
    with pytest.raises(AttnlabError, match="NaN"):
        head_scores(np.full((1, 1, 2, 2), np.nan), [1, 2], "induction")
    with pytest.raises(ShapeError, match="B = 2"):
        head_scores(np.ones((2, 1, 1, 2, 2)) / 2, [[1, 2]], "induction")
