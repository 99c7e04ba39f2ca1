"""attnlab.train.tasks: the sequences are what each task says, the held-out split is fixed by
the seed and never appears in training batches."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.errors import AttnlabError
from attnlab.train.tasks import IGNORE, TASK_NAMES, make_task


def _full(inputs, targets, answer_start):
    """Rebuild the (N, T + 1) sequences from inputs and the scored targets."""
    seqs = np.concatenate([inputs, inputs[:, -1:]], axis=1)
    seqs[:, answer_start + 1:] = targets[:, answer_start:]
    return seqs


@pytest.mark.parametrize("name, check", [
    ("sort", lambda a, b: np.array_equal(np.sort(a, axis=1), b)),
    ("reverse", lambda a, b: np.array_equal(a[:, ::-1], b)),
    ("copy", lambda a, b: np.array_equal(a, b)),
])
def test_sequence_tasks_answer_what_they_say(name, check):
    task = make_task(name, length=5, digits=7, heldout=50, seed=3)
    assert task.seq_len == 9 and task.answer_start == 4 and task.vocab_size == 7
    for inputs, targets in (task.batch(np.random.default_rng(0), 64),
                            (task.heldout_inputs, task.heldout_targets)):
        assert (targets[:, :4] == IGNORE).all() and (targets[:, 4:] >= 0).all()
        seqs = _full(inputs, targets, 4)
        assert np.array_equal(seqs[:, 1:-1], inputs[:, 1:])  # targets are the next tokens
        assert check(seqs[:, :5], seqs[:, 5:])
        assert seqs.min() >= 0 and seqs.max() < 7


def test_induction_is_bos_then_a_sequence_repeated():
    task = make_task("induction", period=5, vocab=11, heldout=20, seed=1)
    assert task.period == 5 and task.vocab_size == 12 and task.options["min_period"] == 2
    held = np.concatenate([task.heldout_inputs, task.heldout_targets[:, -1:]], axis=1)
    assert (held[:, 0] == 11).all() and np.array_equal(held[:, 1:6], held[:, 6:])
    assert (task.heldout_targets >= 0).all()  # every next token is scored
    inputs, targets = task.batch(np.random.default_rng(2), 200)
    assert inputs.shape == (200, 10) and (inputs[:, 0] == 11).all()
    assert np.array_equal(targets[:, :-1], inputs[:, 1:]) and (targets >= 0).all()
    seqs = np.concatenate([inputs, targets[:, -1:]], axis=1)  # (B, 11)
    lengths = set()
    for row in seqs:  # the row ends with a repeat of n tokens, n in 2 .. 5
        n = max(n for n in range(2, 6) if np.array_equal(row[11 - 2 * n:11 - n], row[11 - n:]))
        lengths.add(n)
    assert lengths == {2, 3, 4, 5}  # the distance varies: positions alone cannot find it


def test_modadd_is_a_partition_of_all_pairs():
    task = make_task("modadd", p=7, train_fraction=0.5, seed=0)
    held = {tuple(row[:2]) for row in task.heldout_inputs}
    assert task.train_pool is not None
    train = {tuple(row[:2]) for row in task.train_pool}
    assert len(held) + len(train) == 49 and not held & train
    assert len(train) == round(0.5 * 49)
    a, b, eq = task.heldout_inputs.T
    assert (eq == 7).all() and (targets_c := task.heldout_targets[:, 2]).tolist() == \
        ((a + b) % 7).tolist()
    assert (task.heldout_targets[:, :2] == IGNORE).all() and len(targets_c) == 49 - 24


@pytest.mark.parametrize("name", TASK_NAMES)
def test_heldout_is_fixed_by_the_seed_and_never_trained_on(name):
    options = {"modadd": {"p": 11}, "induction": {"period": 3, "vocab": 4, "heldout": 20}}.get(
        name, {"length": 3, "digits": 4, "heldout": 20})
    a, b = make_task(name, **options, seed=5), make_task(name, **options, seed=5)
    c = make_task(name, **options, seed=6)
    assert np.array_equal(a.heldout_inputs, b.heldout_inputs)
    assert not np.array_equal(a.heldout_inputs, c.heldout_inputs)
    assert len({row.tobytes() for row in a.heldout_inputs}) == len(a.heldout_inputs)
    held = {row.tobytes() for row in np.concatenate(
        [a.heldout_inputs, a.heldout_targets], axis=1)}
    rng = np.random.default_rng(0)
    for _ in range(20):  # small spaces (64 examples, 20 held out): clashes are common
        inputs, targets = a.batch(rng, 32)
        rows = {row.tobytes() for row in np.concatenate([inputs, targets], axis=1)}
        assert not rows & held


def test_bad_options_are_named():
    with pytest.raises(AttnlabError, match="name: expected one of"):
        make_task("parity")
    with pytest.raises(AttnlabError, match="heldout: expected at most half"):
        make_task("sort", length=2, digits=3, heldout=5)
    with pytest.raises(AttnlabError, match="options: sort does not take"):
        make_task("sort", p=3)
    with pytest.raises(AttnlabError, match="train_fraction"):
        make_task("modadd", train_fraction=1.5)
    with pytest.raises(AttnlabError, match="length"):
        make_task("copy", length=0)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_a_negative_seed_is_refused_by_name(name):
    # NumPy's own refusal ("expected non-negative integer") named no argument.
    for seed in (-1, 1.5, True):
        with pytest.raises(AttnlabError, match=r"^seed: expected an integer"):
            make_task(name, seed=seed)


def test_the_tasks_import_without_torch():
    """attnlab.train.tasks is NumPy only: with torch blocked it imports and works, and
    the trainer's names say how to install torch."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from attnlab.train.tasks import make_task\n"
        "assert make_task('sort', heldout=4).heldout_inputs.shape[0] == 4\n"
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules\n"
        "               if sys.modules[m] is not None)\n"
        "try:\n"
        "    from attnlab.train import train\n"
        "except ImportError as exc:\n"
        "    assert \"pip install 'attnlab[torch]'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('attnlab.train.train imported without torch')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
