"""The sort task's detector, "attends to the next output": hand-built patterns whose
scores are worked out by hand here, and the trainer's sort report that carries it."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.cli.train import _summary
from attnlab.errors import AttnlabError
from attnlab.train import DecoderConfig, TrainConfig, next_output_scores, train
from attnlab.train.tasks import IGNORE, make_task

# One sort example, length 4: prompt 3 1 2 1, answer 1 1 2 3. The model reads
# seq[:-1] and predicts seq[1:]; the answer is scored from position 3 on.
INPUTS = np.array([[3, 1, 2, 1, 1, 1, 2]])  # (1, T = 7)
TARGETS = np.array([[IGNORE, IGNORE, IGNORE, 1, 1, 2, 3]])  # (1, 7)
PROMPT = 4


def _pattern(rows: dict[int, dict[int, float]]) -> np.ndarray:
    """(1, 1, 1, 7, 7): the given rows, every other row on its own position."""
    w = np.eye(7)
    for t, row in rows.items():
        w[t] = 0.0
        for j, value in row.items():
            w[t, j] = value
    return w[None, None, None]


def test_a_head_on_the_next_output_scores_one():
    # t=3 and t=4 emit 1 (prompt positions 1 and 3), t=5 emits 2 (position 2), t=6 emits 3 (0)
    exact = _pattern({3: {1: 1.0}, 4: {3: 1.0}, 5: {2: 1.0}, 6: {0: 1.0}})
    assert next_output_scores(exact, INPUTS, TARGETS, PROMPT).tolist() == [[1.0]]
    # both copies of a repeated digit count: half on each copy is still all on the value
    split = _pattern({3: {1: 0.5, 3: 0.5}, 4: {1: 0.5, 3: 0.5}, 5: {2: 1.0}, 6: {0: 1.0}})
    assert next_output_scores(split, INPUTS, TARGETS, PROMPT).tolist() == [[1.0]]


def test_a_head_on_the_answer_or_a_wrong_digit_scores_zero():
    # the diagonal: at t=4 the current token is 1, the next output too, but it sits in
    # the answer, not the prompt; at t=3 the current token is prompt 1 (position 3),
    # which is the next output, so only that row counts: 1 of 4 scored rows
    diagonal = np.eye(7)[None, None, None]
    np.testing.assert_allclose(next_output_scores(diagonal, INPUTS, TARGETS, PROMPT),
                               [[1 / 4]], rtol=0, atol=1e-15)
    wrong = _pattern({3: {0: 1.0}, 4: {2: 1.0}, 5: {0: 1.0}, 6: {1: 1.0}})
    assert next_output_scores(wrong, INPUTS, TARGETS, PROMPT).tolist() == [[0.0]]


def test_uniform_causal_attention_scores_count_over_visible_positions():
    causal = np.tril(np.ones((7, 7))) / np.arange(1, 8)[:, None]
    # by hand: rows 3..6 see 4..7 positions; the value emitted (1, 1, 2, 3) is in the
    # prompt 2, 2, 1, 1 times
    expected = (2 / 4 + 2 / 5 + 1 / 6 + 1 / 7) / 4  # 0.3024, about 1/S for S ~ 4..7
    np.testing.assert_allclose(next_output_scores(causal[None, None, None], INPUTS, TARGETS,
                                                  PROMPT), [[expected]], rtol=1e-14, atol=0)


def test_the_exact_pattern_scores_one_on_the_tasks_own_data():
    task = make_task("sort", length=5, digits=4, heldout=30)
    ids, tgt = task.heldout_inputs, task.heldout_targets  # (30, 9)
    B, T = ids.shape
    w = np.zeros((B, 2, 3, T, T))
    w[..., np.arange(T), np.arange(T)] = 1.0  # rows that are not scored: on themselves
    for b in range(B):
        for t in range(task.answer_start, T):
            j = list(ids[b, : task.answer_start + 1]).index(tgt[b, t])  # a prompt copy
            w[b, :, :, t] = 0.0
            w[b, :, :, t, j] = 1.0
    np.testing.assert_array_equal(
        next_output_scores(w, ids, tgt, task.answer_start + 1), np.ones((2, 3)))


def test_bad_input_is_named():
    w = np.eye(7)[None, None, None]
    with pytest.raises(AttnlabError, match="weights") as error:
        next_output_scores(w[0], INPUTS, TARGETS, PROMPT)
    assert error.value.message.render("zh").startswith("weights：需要形状")  # keyed, both languages
    with pytest.raises(AttnlabError, match="inputs, targets"):
        next_output_scores(w, INPUTS[:, :5], TARGETS, PROMPT)
    with pytest.raises(AttnlabError, match="prompt_len"):
        next_output_scores(w, INPUTS, TARGETS, 8)
    with pytest.raises(AttnlabError, match="targets"):
        next_output_scores(w, INPUTS, np.full_like(TARGETS, IGNORE), PROMPT)


def test_the_sort_report_carries_next_output():
    task = make_task("sort", length=4, digits=5, heldout=50)
    config = DecoderConfig(task.vocab_size, task.seq_len, d_model=16, num_heads=2, num_layers=2)
    result = train(task, config, TrainConfig(steps=6, batch_size=8, snapshots=3,
                                             snapshot_batch=10))
    history = result.head_history["next_output"]
    assert history.shape == (3, 2, 2) and np.all((history >= 0) & (history <= 1))
    metrics = result.metrics()
    assert len(metrics["history"]["head_scores"]["next_output"]) == 3
    # the uniform baseline on the same 10 examples, by the same definition as above
    ids, tgt = task.heldout_inputs[:10], task.heldout_targets[:10]
    by_hand = np.mean([(ids[b, :4] == tgt[b, t]).sum() / (t + 1)
                       for b in range(10) for t in range(3, 7)])
    assert metrics["next_output_uniform"] == pytest.approx(by_hand, rel=1e-12)
    en, zh = _summary(metrics, zh=False), _summary(metrics, zh=True)
    assert "best next-output head" in en and "do not apply to sort" in en
    assert "best previous-token head" not in en and "best induction head" not in en
    assert "“下一个输出”头" in zh and "不适用于 sort" in zh
