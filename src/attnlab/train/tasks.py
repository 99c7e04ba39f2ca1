"""Synthetic sequence tasks for watching attention learn: copy, reverse, sort,
induction (``[x][x]``) and modular addition, each with a fixed-seed held-out split.

Every task is next-token prediction on short integer sequences. An example is one
sequence ``seq`` of length T + 1; the model reads ``inputs = seq[:-1]`` (T,) and is
scored on ``targets = seq[1:]`` (T,), where ``IGNORE`` (-1) marks the positions that
are not scored (the prompt, for the tasks with an answer)::

    sort     3 1 2 0 2 1 | 0 1 1 2 2 3        scored: the answer
    reverse  3 1 2 0 2 1 | 1 2 0 2 1 3
    copy     3 1 2 0 2 1 | 3 1 2 0 2 1
    induction  BOS x1 .. xn x1 .. xn            scored: every next token (the first
                                                half is random, the second predictable)
    modadd   a b = c, c = (a + b) mod p         scored: c

The held-out split is drawn once from ``seed`` and held apart: training batches
never contain a held-out example (rows that collide are drawn again), and for
modular addition, whose examples are all p² pairs, the split is a fixed partition.

Dimension legend: N examples, B batch, T sequence length (model input).

>>> task = make_task("sort", heldout=100)
>>> task.heldout_inputs.shape, task.vocab_size
((100, 11), 10)
>>> inputs, targets = task.batch(np.random.default_rng(0), 4)
>>> inputs.shape, int((targets[0] >= 0).sum())
((4, 11), 6)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..checks import check_positive_int
from ..errors import AttnlabError

__all__ = [
    "IGNORE",
    "TASK_NAMES",
    "Task",
    "make_task",
    "sort_task",
    "reverse_task",
    "copy_task",
    "induction_task",
    "modadd_task",
]

IGNORE = -1
"""The target of a position that is not scored."""

#: (rng, n) -> (n, T + 1) int64 sequences; what a task is made of.
Sampler = Callable[[np.random.Generator, int], np.ndarray]


@dataclass(frozen=True, eq=False)
class Task:
    """A next-token task: a sampler of training batches and a fixed held-out split.

    Attributes:
        name: "sort", "reverse", "copy", "induction" or "modadd".
        vocab_size: V; tokens are 0 .. V-1.
        seq_len: T, the model's input length.
        answer_start: the first scored position of ``targets`` (0 for induction).
        heldout_inputs, heldout_targets: (N, T) int64, fixed by ``seed``.
        period: for induction, the repeat length n (position i attends to i - n + 1
            in an induction head); else None.
        labels: a printable label per token id.
        options: the sizes the task was made with (for metrics files).
    """

    name: str
    vocab_size: int
    seq_len: int
    answer_start: int
    heldout_inputs: np.ndarray = field(repr=False)
    heldout_targets: np.ndarray = field(repr=False)
    labels: tuple[str, ...]
    options: dict[str, Any]
    period: int | None = None
    sampler: Sampler | None = field(default=None, repr=False)
    train_pool: np.ndarray | None = field(default=None, repr=False)  # modadd: (M, T + 1)
    heldout_keys: frozenset[bytes] = field(default=frozenset(), repr=False)

    def batch(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """A training batch, never a held-out example: (B, T) inputs, (B, T) targets."""
        size = check_positive_int(size, "size")
        if self.train_pool is not None:
            seqs = self.train_pool[rng.integers(0, len(self.train_pool), size)]  # (B, T + 1)
        else:
            assert self.sampler is not None
            seqs = self.sampler(rng, size)  # (B, T + 1)
            for _ in range(100):  # redraw the rows that are held-out examples
                clash = [i for i, row in enumerate(seqs) if row.tobytes() in self.heldout_keys]
                if not clash:
                    break
                seqs[clash] = self.sampler(rng, len(clash))
        return _split(seqs, self.answer_start)

    def describe(self) -> str:
        """One line: the task and its sizes."""
        sizes = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"{self.name} ({sizes}; T={self.seq_len}, V={self.vocab_size}, " \
               f"{len(self.heldout_inputs)} held out)"


def _split(seqs: np.ndarray, answer_start: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, T + 1) sequences -> (N, T) inputs and (N, T) targets, unscored before answer_start."""
    inputs = np.ascontiguousarray(seqs[:, :-1])  # (N, T)
    targets = seqs[:, 1:].copy()  # (N, T)
    targets[:, :answer_start] = IGNORE
    return inputs, targets


def _heldout(sampler: Sampler, count: int, seed: int, space: int) -> np.ndarray:
    """``count`` distinct sequences from ``sampler`` with ``seed`` (refused if the task has
    fewer than twice as many distinct examples: training needs the rest)."""
    if 2 * count > space:
        raise AttnlabError(
            f"heldout: expected at most half of the task's {space} distinct examples, "
            f"got {count}; make the sequences longer or the held-out split smaller"
        )
    rng = np.random.default_rng([seed, 0x5EED])  # a stream of its own: training uses seed
    found: dict[bytes, np.ndarray] = {}
    while len(found) < count:
        for row in sampler(rng, count):
            found.setdefault(row.tobytes(), row)
            if len(found) == count:
                break
    return np.stack(list(found.values()))  # (N, T + 1)


def _sequence_task(
    name: str, transform: Callable[[np.ndarray], np.ndarray], length: int, digits: int,
    heldout: int, seed: int,
) -> Task:
    length = check_positive_int(length, "length")
    digits = check_positive_int(digits, "digits")
    heldout = check_positive_int(heldout, "heldout")
    seed = check_positive_int(seed, "seed", allow_zero=True)  # NumPy's refusal names nothing
    if digits < 2:
        raise AttnlabError(f"digits: expected at least 2 symbols, got {digits}")

    def sampler(rng: np.random.Generator, n: int) -> np.ndarray:  # -> (n, 2 * length)
        prompt = rng.integers(0, digits, size=(n, length))  # (n, length)
        return np.concatenate([prompt, transform(prompt)], axis=1)

    held = _heldout(sampler, heldout, seed, digits ** min(length, 40))
    inputs, targets = _split(held, length - 1)
    return Task(
        name=name, vocab_size=digits, seq_len=2 * length - 1, answer_start=length - 1,
        heldout_inputs=inputs, heldout_targets=targets,
        labels=tuple(str(d) for d in range(digits)),
        options={"length": length, "digits": digits, "heldout": heldout, "seed": seed},
        sampler=sampler, heldout_keys=frozenset(row.tobytes() for row in held),
    )


def sort_task(*, length: int = 6, digits: int = 10, heldout: int = 5000, seed: int = 0) -> Task:
    """``length`` digits in 0 .. digits-1, then the same digits sorted (minGPT's demo)."""
    return _sequence_task("sort", lambda a: np.sort(a, axis=1), length, digits, heldout, seed)


def reverse_task(
    *, length: int = 6, digits: int = 10, heldout: int = 5000, seed: int = 0
) -> Task:
    """``length`` digits, then the same digits in reverse order (needs positions)."""
    return _sequence_task("reverse", lambda a: a[:, ::-1], length, digits, heldout, seed)


def copy_task(*, length: int = 6, digits: int = 10, heldout: int = 5000, seed: int = 0) -> Task:
    """``length`` digits, then the same digits again."""
    return _sequence_task("copy", lambda a: a.copy(), length, digits, heldout, seed)


def induction_task(
    *, period: int = 16, vocab: int = 32, heldout: int = 1000, min_period: int | None = None,
    seed: int = 0,
) -> Task:
    """``BOS x x``: ``period`` random tokens repeated once, after a BOS token (id ``vocab``).

    Every next token is scored: in the first copy they are random (the loss can only
    fall to log V), in the repeat an induction head predicts them exactly.

    Held-out sequences are exactly ``BOS x x``. In training batches each row repeats
    a sequence of random length n in ``min_period`` .. ``period`` (default period // 2)
    after 2 (period - n) random filler tokens, so that T is the same but the repeat
    sits at a different distance in each row: a head that attends a fixed number of
    positions back cannot solve it, only one that looks for the earlier copy of the
    current token (an induction head) can.
    """
    period = check_positive_int(period, "period")
    vocab = check_positive_int(vocab, "vocab")
    heldout = check_positive_int(heldout, "heldout")
    seed = check_positive_int(seed, "seed", allow_zero=True)
    if period < 2 or vocab < 2:
        raise AttnlabError(f"period, vocab: expected at least 2 each, got {period}, {vocab}")
    low = max(2, period // 2) if min_period is None else check_positive_int(min_period,
                                                                            "min_period")
    if not 2 <= low <= period:
        raise AttnlabError(f"min_period: expected 2 .. period = {period}, got {low}")
    bos = vocab

    def repeated(rng: np.random.Generator, n: int) -> np.ndarray:  # -> (n, 2 * period + 1)
        x = rng.integers(0, vocab, size=(n, period))  # (n, period)
        return np.concatenate([np.full((n, 1), bos), x, x], axis=1)

    def sampler(rng: np.random.Generator, n: int) -> np.ndarray:  # -> (n, 2 * period + 1)
        seqs = rng.integers(0, vocab, size=(n, 2 * period + 1))  # filler everywhere
        seqs[:, 0] = bos
        lengths = rng.integers(low, period + 1, size=n)  # (n,)
        for row, length in zip(seqs, lengths, strict=True):
            start = 1 + 2 * (period - length)
            row[start + length:] = row[start:start + length]  # the repeat ends the row
        return seqs

    held = _heldout(repeated, heldout, seed, vocab ** min(period, 40))
    inputs, targets = _split(held, 0)
    return Task(
        name="induction", vocab_size=vocab + 1, seq_len=2 * period, answer_start=0,
        heldout_inputs=inputs, heldout_targets=targets,
        labels=(*(str(t) for t in range(vocab)), "BOS"),
        options={"period": period, "vocab": vocab, "heldout": heldout, "min_period": low,
                 "seed": seed},
        period=period, sampler=sampler, heldout_keys=frozenset(row.tobytes() for row in held),
    )


def modadd_task(*, p: int = 23, train_fraction: float = 0.5, seed: int = 0) -> Task:
    """``a b = c`` with c = (a + b) mod p; the p² pairs are split once into train / held out.

    Tokens 0 .. p-1 are numbers, p is "=". A small p keeps it CPU-sized; learning the
    held-out pairs (rather than memorising the training ones) is slow: "grokking".
    """
    p = check_positive_int(p, "p")
    seed = check_positive_int(seed, "seed", allow_zero=True)
    if p < 2:
        raise AttnlabError(f"p: expected at least 2, got {p}")
    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)) \
            or not 0.0 < train_fraction < 1.0:
        raise AttnlabError(f"train_fraction: expected a number in (0, 1), got {train_fraction!r}")
    a, b = np.divmod(np.arange(p * p), p)  # (p²,) each
    seqs = np.stack([a, b, np.full_like(a, p), (a + b) % p], axis=1)  # (p², 4)
    order = np.random.default_rng([seed, 0x5EED]).permutation(p * p)
    n_train = int(round(train_fraction * p * p))
    if not 0 < n_train < p * p:
        raise AttnlabError(f"train_fraction: leaves no train or no held-out pair at p = {p}")
    train, held = seqs[order[:n_train]], seqs[order[n_train:]]
    inputs, targets = _split(held, 2)
    return Task(
        name="modadd", vocab_size=p + 1, seq_len=3, answer_start=2,
        heldout_inputs=inputs, heldout_targets=targets,
        labels=(*(str(t) for t in range(p)), "="),
        options={"p": p, "train_fraction": float(train_fraction), "seed": seed},
        train_pool=train,
    )


_MAKERS: dict[str, Callable[..., Task]] = {
    "sort": sort_task,
    "reverse": reverse_task,
    "copy": copy_task,
    "induction": induction_task,
    "modadd": modadd_task,
}
TASK_NAMES = tuple(_MAKERS)


def make_task(name: str, **options: Any) -> Task:
    """The task called ``name`` (one of :data:`TASK_NAMES`) made with ``options``."""
    if name not in _MAKERS:
        raise AttnlabError(f"name: expected one of {', '.join(TASK_NAMES)}, got {name!r}")
    try:
        return _MAKERS[name](**options)
    except TypeError as exc:  # an option this task does not have
        raise AttnlabError(f"options: {name} does not take these options ({exc})") from None
