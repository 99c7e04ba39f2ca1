"""attnlab.lens.diagnostics against hand-checkable matrices and independent computations.

scipy is not a dependency: every reference value is computed here by hand (and written
as a formula), on matrices small enough to check on paper.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import attnlab
from attnlab.errors import AttnlabError, ShapeError
from attnlab.lens.diagnostics import (
    NEAR_DUPLICATE_JS,
    Diagnostics,
    diagnose,
    diagnose_trace,
    trace_weights,
)
from attnlab.report import diagnostics_table

T = 4
UNIFORM = np.full((T, T), 1 / T)
IDENTITY = np.eye(T)
# Previous-token head: query i looks at key i-1; query 0 has no previous token, so it
# looks at itself.
PREVIOUS = np.eye(T, k=-1) + np.diag([1.0, 0, 0, 0])
NEXT = np.eye(T, k=1) + np.diag([0, 0, 0, 1.0])
# A permutation without fixed points: every row is one-hot on a key the identity never uses.
SWAPPED = np.roll(np.eye(T), 2, axis=1)



def exact(value: float) -> object:
    """Equal up to float64 rounding: the references are exact arithmetic."""
    return pytest.approx(value, rel=1e-12, abs=1e-12)


def heads(*matrices: np.ndarray) -> np.ndarray:
    return np.stack(matrices)[None]  # (1, H, T, S)


def entropy_reference(row: list[float], n_keys: int) -> float:
    """-Σ p ln p / ln n, written out with the 0·log 0 = 0 convention."""
    return -sum(p * math.log(p) for p in row if p > 0) / math.log(n_keys)


# ------------------------------------------------------------------ head metrics


def test_uniform_head_has_entropy_one_and_is_flagged_near_uniform() -> None:
    head = diagnose(heads(UNIFORM)).head(0, 0)
    assert head.entropy == exact(1.0)
    assert head.max_weight == exact(0.25)
    assert head.near_uniform and not head.over_sparse
    # Uniform rows give 1/T to every position, neighbours included.
    assert head.previous_token == head.next_token == head.self_token == pytest.approx(0.25)
    assert head.flags == ["near_uniform"]
    assert head.rows == T


def test_identity_head_is_over_sparse_and_self_attending() -> None:
    head = diagnose(heads(IDENTITY)).head(0, 0)
    assert head.entropy == 0.0
    assert head.max_weight == 1.0
    assert head.over_sparse and not head.near_uniform
    assert head.self_token == 1.0
    assert head.previous_token == 0.0 and head.next_token == 0.0
    assert head.flags == ["over_sparse", "self"]


def test_shifted_identity_is_a_previous_token_head() -> None:
    report = diagnose(heads(PREVIOUS, NEXT))
    previous, following = report.head(0, 0), report.head(0, 1)
    # Rows 1..3 put weight 1 on i-1; row 0 has no key i-1 and is not part of that mean.
    assert previous.previous_token == 1.0
    assert previous.next_token == 0.0
    assert previous.self_token == pytest.approx(1 / 4)  # only row 0 looks at itself
    assert following.next_token == 1.0 and following.previous_token == 0.0
    assert "previous_token" in previous.flags and "next_token" in following.flags


def test_entropy_and_max_weight_of_mixed_rows_match_hand_computation() -> None:
    rows = [[0.5, 0.5, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1], [1.0, 0.0, 0.0, 0.0],
            [0.25, 0.25, 0.25, 0.25]]
    head = diagnose(np.array(rows)[None]).head(0, 0)  # (H, T, S) is read as L = 1
    expected = float(np.mean([entropy_reference(r, 4) for r in rows]))
    # Row 0 by hand: ln 2 / ln 4 = 0.5.
    assert entropy_reference(rows[0], 4) == pytest.approx(0.5)
    assert head.entropy == exact(expected)
    assert head.max_weight == exact((0.5 + 0.7 + 1.0 + 0.25) / 4)
    assert head.self_token == exact((0.5 + 0.1 + 0.0 + 0.25) / 4)


def test_threshold_edges_decide_the_flags() -> None:
    # Max weight 0.95 on 4 keys: over-sparse by the max-weight rule alone.
    sharp = np.full((T, T), 0.05 / 3)
    np.fill_diagonal(sharp, 0.95)
    head = diagnose(heads(sharp)).head(0, 0)
    assert head.entropy is not None and head.entropy > 0.1
    assert head.over_sparse
    # 0.4 / 0.2 / 0.2 / 0.2: entropy 0.961 > 0.9 -> near uniform; max 0.4 -> not sparse.
    soft = np.full((T, T), 0.2)
    np.fill_diagonal(soft, 0.4)
    head = diagnose(heads(soft)).head(0, 0)
    assert head.entropy == pytest.approx(entropy_reference([0.4, 0.2, 0.2, 0.2], 4))
    assert head.near_uniform and not head.over_sparse


# ------------------------------------------------------------- special tokens


TOKENS = ["[CLS]", "the", "cat", "[SEP]"]


def test_sink_head_is_found_from_the_special_tokens() -> None:
    on_sep = np.zeros((T, T))
    on_sep[:, 3] = 1.0
    # 0.8 on [CLS] + [SEP]: above 0.5 and above 1.5 x the chance share 2/4.
    half = np.tile([0.3, 0.1, 0.1, 0.5], (T, 1))
    report = diagnose(heads(on_sep, UNIFORM, half), TOKENS)
    assert report.special_indices == [0, 3]
    assert report.head(0, 0).special_share == 1.0 and report.head(0, 0).sink
    # Uniform: 2 of 4 keys are special, share 0.5 -- not above SINK_SHARE.
    assert report.head(0, 1).special_share == pytest.approx(0.5) and not report.head(0, 1).sink
    assert report.head(0, 2).special_share == pytest.approx(0.8) and report.head(0, 2).sink


def test_short_input_uniform_head_is_not_a_sink_by_chance() -> None:
    third = np.full((3, 3), 1 / 3)
    head = diagnose(third[None], ["[CLS]", "hi", "[SEP]"]).head(0, 0)
    assert head.special_share == pytest.approx(2 / 3)  # above 0.5, but only chance level
    assert not head.sink
    on_sep = np.zeros((3, 3))
    on_sep[:, 2] = 1.0
    assert diagnose(on_sep[None], ["[CLS]", "hi", "[SEP]"]).head(0, 0).sink


def test_special_indices_given_by_the_caller_override_the_tokens() -> None:
    on_first = np.zeros((T, T))
    on_first[:, 1] = 1.0
    report = diagnose(heads(on_first), TOKENS, special_indices=[1])
    assert report.special_indices == [1]
    assert report.head(0, 0).special_share == 1.0 and report.head(0, 0).sink
    # Without tokens or indices the share is unknown, not 0.
    unknown = diagnose(heads(on_first)).head(0, 0)
    assert unknown.special_share is None and not unknown.sink


# ------------------------------------------------------------- padding and masks


def test_key_padding_excludes_padded_keys_and_rows() -> None:
    weights = np.zeros((T, T))
    weights[:3, :3] = 1 / 3  # real rows: uniform over the 3 real keys
    weights[3] = [0.0, 0.0, 0.0, 1.0]  # padded query row: anything; must not count
    padding = np.array([True, True, True, False])
    for report in (diagnose(heads(weights), key_padding=padding),
                   diagnose(heads(weights), valid_length=3)):
        head = report.head(0, 0)
        assert head.rows == 3
        # Normalised by ln 3 (3 attendable keys), not ln 4: exactly uniform.
        assert head.entropy == exact(1.0)
        assert head.max_weight == exact(1 / 3)
        assert head.near_uniform
    # Without the padding the same weights read differently (ln 4, padded row counted).
    plain = diagnose(heads(weights)).head(0, 0)
    assert plain.entropy == exact(
        (3 * entropy_reference([1 / 3] * 3, 4) + 0) / 4)


def test_left_padding_keeps_neighbours_among_real_tokens() -> None:
    weights = np.zeros((T, T))
    weights[0, 1] = 1.0  # padded row (ignored)
    weights[1, 1] = 1.0  # first real token: no previous one, looks at itself
    weights[2, 1] = weights[3, 2] = 1.0  # previous real token
    head = diagnose(heads(weights), key_padding=np.array([False, True, True, True])).head(0, 0)
    assert head.previous_token == 1.0 and head.rows == 3


def test_causal_mask_normalises_each_row_by_its_own_key_count() -> None:
    causal = attnlab.causal_mask(T)
    weights = causal / causal.sum(axis=1, keepdims=True)  # row i uniform over i+1 keys
    head = diagnose(heads(weights), mask=causal).head(0, 0)
    assert head.entropy == exact(1.0)  # row 0 (one key) is left out
    assert head.max_weight == exact((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)
    assert head.previous_token == exact((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert head.next_token is None  # a causal query can never see i+1


def test_fully_masked_zero_rows_are_skipped() -> None:
    weights = UNIFORM.copy()
    weights[2] = 0.0  # attnlab's softmax gives a row with nothing to attend to zeros
    head = diagnose(heads(weights)).head(0, 0)
    assert head.rows == 3 and head.entropy == pytest.approx(1.0)


def test_weight_on_excluded_keys_is_an_error_not_ignored() -> None:
    with pytest.raises(AttnlabError, match="mask/key_padding exclude"):
        diagnose(heads(UNIFORM), mask=attnlab.causal_mask(T))


def test_cross_attention_has_no_positional_scores() -> None:
    weights = np.full((1, 1, 2, 3), 1 / 3)  # T = 2 queries, S = 3 keys
    head = diagnose(weights, ["a", "b"], key_tokens=["[CLS]", "x", "[SEP]"]).head(0, 0)
    assert head.previous_token is head.next_token is head.self_token is None
    assert head.special_share == pytest.approx(2 / 3)


# ---------------------------------------------------------------- head diversity


def js_distance_reference(p: list[float], q: list[float]) -> float:
    """sqrt(½ KL(p‖m) + ½ KL(q‖m)), m = (p + q) / 2, base-2 logarithms."""
    m = [(a + b) / 2 for a, b in zip(p, q, strict=True)]

    def kl(a: list[float]) -> float:
        return sum(x * math.log2(x / y) for x, y in zip(a, m, strict=True) if x > 0)

    return math.sqrt(0.5 * kl(p) + 0.5 * kl(q))


def test_identical_heads_have_js_distance_zero_and_are_flagged() -> None:
    layer = diagnose(heads(PREVIOUS, PREVIOUS, UNIFORM)).layers[0]
    assert layer.js_distance[0, 1] == 0.0
    assert layer.near_duplicates == [(0, 1, 0.0)]
    assert layer.closest_pair == (0, 1, 0.0)


def test_disjoint_one_hot_heads_have_js_distance_one() -> None:
    layer = diagnose(heads(IDENTITY, SWAPPED)).layers[0]
    assert layer.js_distance[0, 1] == exact(1.0)
    assert layer.js_distance[1, 0] == layer.js_distance[0, 1]
    assert np.diag(layer.js_distance).tolist() == [0.0, 0.0]
    assert layer.near_duplicates == []


def test_js_distance_of_partial_overlap_matches_hand_computation() -> None:
    one_hot = np.tile([1.0, 0.0], (2, 1))
    half = np.tile([0.5, 0.5], (2, 1))
    layer = diagnose(np.stack([one_hot, half])[None]).layers[0]
    # By hand: m = (3/4, 1/4); KL(p‖m) = log2(4/3); KL(q‖m) = ½ log2(2/3) + ½ log2(2).
    by_hand = math.sqrt(0.5 * math.log2(4 / 3) + 0.5 * (0.5 * math.log2(2 / 3) + 0.5))
    assert by_hand == pytest.approx(js_distance_reference([1, 0], [0.5, 0.5]))
    assert layer.js_distance[0, 1] == exact(by_hand)
    assert layer.mean_js_distance == exact(by_hand)


def test_js_distance_is_a_mean_over_rows_and_respects_the_threshold() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.dirichlet(np.ones(5), size=(2, 5))  # two heads, 5 rows of 5 keys
    layer = diagnose(np.stack([a, b])[None]).layers[0]
    expected = np.mean([js_distance_reference(list(p), list(q)) for p, q in zip(a, b, strict=True)])
    assert layer.js_distance[0, 1] == pytest.approx(expected, rel=1e-12)
    close = a.copy()
    close[:, 0] += 0.01  # move 1 % of the mass of every row
    close[:, 1] -= 0.01
    close = np.clip(close, 0, None)
    close /= close.sum(axis=1, keepdims=True)
    near = diagnose(np.stack([a, close])[None]).layers[0]
    assert 0 < near.js_distance[0, 1] < NEAR_DUPLICATE_JS
    assert [pair[:2] for pair in near.near_duplicates] == [(0, 1)]


def test_single_head_layer_has_no_diversity() -> None:
    layer = diagnose(heads(UNIFORM)).layers[0]
    assert layer.mean_js_distance is None and layer.closest_pair is None
    assert layer.js_distance.shape == (1, 1)


def test_layers_are_diagnosed_separately() -> None:
    weights = np.stack([np.stack([UNIFORM, UNIFORM]), np.stack([IDENTITY, SWAPPED])])
    report = diagnose(weights)  # (L, H, T, S) = (2, 2, 4, 4)
    assert report.shape == (2, 2, 4, 4) and len(report.heads) == 4
    assert [h.near_uniform for h in report.heads] == [True, True, False, False]
    assert report.layers[0].near_duplicates and not report.layers[1].near_duplicates


# ------------------------------------------------------------------------ export


def test_to_dict_and_to_json_round_trip_without_nan() -> None:
    weights = np.stack([IDENTITY, IDENTITY])[None]
    weights[0, 1] = np.eye(T)  # a second identical head
    report = diagnose(weights, TOKENS, mask=np.eye(T, dtype=bool))
    data = json.loads(report.to_json())  # allow_nan=False: no NaN may be written
    assert data["shape"] == {"L": 1, "H": 2, "T": 4, "S": 4}
    assert data["heads"][0]["entropy"] is None  # one attendable key per row: undefined
    # Identity over [CLS] the cat [SEP]: share 2/4 on specials, not above 0.5: no sink.
    assert data["heads"][0]["flags"] == ["over_sparse", "self"]
    assert data["layers"][0]["js_distance"] == [[0.0, 0.0], [0.0, 0.0]]
    assert data["thresholds"]["near_duplicate_js"] == NEAR_DUPLICATE_JS
    assert report.to_dict() == data


def test_to_table_in_english_and_chinese() -> None:
    report = diagnose(heads(IDENTITY, IDENTITY), TOKENS)
    english = diagnostics_table(report)
    assert "entropy" in english and "over-sparse" in english and "1~2" in english
    lines = english.splitlines()
    assert lines[2].split()[:4] == ["1", "1", "0.000", "1.000"]
    chinese = diagnostics_table(report, "zh")
    assert "归一化熵" in chinese and "过度稀疏" in chinese and "近似重复的头" in chinese
    # An identity head attends to a fixed position (itself): one-hot by design, so the
    # over-sparse rule is said to misfire; Chinese enumeration comma between flags.
    assert "按位置的 one-hot（正常，不算过度稀疏）、关注自身" in chinese
    assert "one-hot by position (expected, not over-sparse), self" in english
    with pytest.raises(AttnlabError, match="lang"):
        diagnostics_table(report, "fr")  # type: ignore[arg-type]


def test_trace_from_explain_is_diagnosed_like_its_weights() -> None:
    trace = attnlab.explain(tokens=["小明", "去了", "学校"], num_heads=2)
    weights = trace_weights(trace)
    assert weights.shape == (1, 2, len(trace.tokens), len(trace.tokens))
    np.testing.assert_array_equal(weights[0], trace.weights())
    report = diagnose_trace(trace)
    assert isinstance(report, Diagnostics) and report.tokens == trace.tokens
    assert report.to_dict() == diagnose(weights, trace.tokens).to_dict()


def test_float16_weights_are_accepted() -> None:
    head = diagnose(heads(UNIFORM).astype(np.float16)).head(0, 0)
    assert head.entropy == pytest.approx(1.0, abs=1e-6)


# -------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"weights": np.ones((4, 4))}, ShapeError, r"weights: expected \(L, H, T, S\)"),
        ({"weights": np.ones((1, 0, 4, 4))}, ShapeError, "weights: expected L, H, T and S"),
        ({"weights": -UNIFORM[None]}, AttnlabError, r"weights: expected .* in \[0, 1\]"),
        ({"weights": UNIFORM[None] * 0.9}, AttnlabError, "weights: expected rows that sum"),
        ({"weights": np.full((1, 4, 4), np.nan)}, AttnlabError, "weights: expected finite"),
        ({"tokens": ["a", "b"]}, AttnlabError, r"tokens: expected 4 labels \(T = 4\)"),
        ({"tokens": "abcd"}, AttnlabError, "tokens: expected a list"),
        ({"key_tokens": ["a"]}, AttnlabError, "key_tokens: expected 4 labels"),
        ({"key_padding": np.ones(4)}, AttnlabError, "key_padding: expected a bool array"),
        ({"key_padding": np.ones(3, bool)}, ShapeError, r"key_padding: expected bool \(S,\)"),
        ({"query_padding": np.ones(5, bool)}, ShapeError, "query_padding: expected bool"),
        ({"valid_length": 0}, AttnlabError, r"valid_length: expected an int in \[1, S = 4\]"),
        ({"valid_length": 2, "key_padding": np.ones(4, bool)}, AttnlabError,
         "valid_length: expected either"),
        ({"mask": np.ones((3, 4), bool)}, ShapeError, "mask: expected a shape broadcastable"),
        ({"mask": np.ones((4, 4))}, AttnlabError, "mask: expected a bool array"),
        ({"special_indices": [4]}, AttnlabError, r"special_indices: expected key indices"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, error: type, pattern: str) -> None:
    weights = kwargs.pop("weights", UNIFORM[None])
    with pytest.raises(error, match=pattern):
        diagnose(weights, **kwargs)


def test_head_lookup_is_checked() -> None:
    report = diagnose(heads(UNIFORM))
    with pytest.raises(AttnlabError, match="layer, head"):
        report.head(0, 1)


def test_trace_without_weights_is_refused() -> None:
    trace = attnlab.Trace(steps=[attnlab.Step("X", np.zeros((2, 2)), "X")], tokens=["a", "b"])
    with pytest.raises(AttnlabError, match="trace: expected a trace holding 'weights'"):
        trace_weights(trace)
