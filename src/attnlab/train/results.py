"""What a training run is set up with and what it records: :class:`TrainConfig`,
:class:`Evaluation` (the model on the held-out split), :class:`TrainResult`, and the
head score written for one task (:func:`next_output_scores`, on sort) beside the
generic :mod:`attnlab.lens.heads` detectors. :mod:`attnlab.train.trainer` fills them.

Dimension legend: K snapshots, L layers, H heads, T tokens, B batch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..checks import check_positive_int
from ..errors import AttnlabError
from ..messages import msg
from .model import Decoder, DecoderConfig
from .tasks import IGNORE, Task

__all__ = ["Evaluation", "GENERIC_DETECTORS_APPLY", "TASK_DETECTORS", "TrainConfig",
           "TrainResult", "next_output_scores", "snapshot_steps"]

#: The detectors written for one task, recorded beside the generic ones of
#: :mod:`attnlab.lens.heads`.
TASK_DETECTORS: dict[str, tuple[str, ...]] = {"sort": ("next_output",)}

#: The tasks on which the generic detectors (previous-token, duplicate-token,
#: induction) describe what a head is for. On sort they describe nothing: a head
#: that sorts looks up the next digit to emit wherever it sits in the prompt.
GENERIC_DETECTORS_APPLY: frozenset[str] = frozenset({"induction", "copy", "reverse", "modadd"})


def next_output_scores(
    weights: Any, inputs: Any, targets: Any, prompt_len: int
) -> np.ndarray:
    """How much each head attends to the next output: (B, L, H, T, T) -> (L, H).

    At a scored position t (``targets[b, t] != IGNORE``) the model is about to emit
    ``targets[b, t]``. The head's score there is the weight it puts on the prompt
    positions j < ``prompt_len`` whose token is that value (all copies of it, when
    the digit repeats), and the score is the mean over every scored position of
    every example. A head that looks exactly at the next output scores 1; one that
    spreads its weight evenly over the t + 1 positions it may see (causal) scores
    the mean of count / (t + 1), count being how often the value is in the prompt.

    On sort, ``prompt_len`` is ``task.answer_start + 1`` (the unsorted digits).
    """
    w = np.asarray(weights, dtype=np.float64)
    ids, tgt = np.asarray(inputs), np.asarray(targets)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2]:
        raise AttnlabError(msg("train.next_output_weights", shape=w.shape))
    B, _, _, T, _ = w.shape
    if ids.shape != (B, T) or tgt.shape != (B, T):
        raise AttnlabError(msg("train.next_output_rows", expected=(B, T), inputs=ids.shape,
                               targets=tgt.shape))
    prompt_len = check_positive_int(prompt_len, "prompt_len")
    if prompt_len > T:
        raise AttnlabError(msg("train.next_output_prompt", T=T, got=prompt_len))
    scored = tgt != IGNORE  # (B, T)
    if not scored.any():
        raise AttnlabError(msg("train.next_output_unscored"))
    # match[b, t, j]: the prompt token at j is the value emitted after position t
    match = (ids[:, None, :prompt_len] == tgt[:, :, None]) & scored[:, :, None]  # (B, T, P)
    on_next = np.einsum("blhtj,btj->blht", w[..., :prompt_len], match.astype(np.float64))
    return on_next.sum(axis=(0, 3)) / scored.sum()  # (L, H)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of :func:`train` (see the module doc)."""

    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    warmup: int = 0
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    seed: int = 0
    snapshots: int = 41
    snapshot_batch: int = 100
    eval_batch: int = 1000

    def __post_init__(self) -> None:
        check_positive_int(self.steps, "steps")
        for name in ("batch_size", "snapshots", "snapshot_batch", "eval_batch"):
            check_positive_int(getattr(self, name), name)
        check_positive_int(self.warmup, "warmup", allow_zero=True)
        check_positive_int(self.seed, "seed", allow_zero=True)
        for name in ("lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
                raise AttnlabError(msg("train.finite_positive", name=name, got=repr(value)))
        if self.grad_clip is not None and not (
                isinstance(self.grad_clip, (int, float)) and self.grad_clip > 0):
            raise AttnlabError(f"grad_clip: expected a number > 0 or None, got {self.grad_clip!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Evaluation:
    """The model on a task's held-out split.

    ``accuracy``: exact match, the share of examples whose every scored token is the
    argmax (teacher-forced; when all are right this is also what greedy decoding
    writes). ``position_loss`` (T,): mean loss at each scored position (NaN where
    nothing is scored). For induction, ``first_half_loss`` / ``second_half_loss``:
    the mean loss on predicting the first copy's tokens and the repeat's.
    """

    loss: float
    accuracy: float
    position_loss: np.ndarray = field(repr=False)
    first_half_loss: float | None = None
    second_half_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"loss": self.loss, "accuracy": self.accuracy,
                "first_half_loss": self.first_half_loss,
                "second_half_loss": self.second_half_loss,
                "position_loss": [None if math.isnan(x) else float(x)
                                  for x in self.position_loss]}


@dataclass(eq=False)
class TrainResult:
    """What :func:`train` learned and saw. Arrays: ``losses`` (steps,), ``snapshots``
    (K, L, H, T, T) float32 on ``snapshot_tokens`` (T,), ``head_history`` {detector: (K, L, H)},
    ``heldout_loss`` (K,)."""

    task: Task
    model_config: DecoderConfig
    config: TrainConfig
    model: Decoder
    losses: np.ndarray
    snapshot_steps: list[int]
    snapshots: np.ndarray
    snapshot_tokens: np.ndarray
    head_history: dict[str, np.ndarray]
    heldout_loss: np.ndarray
    evaluation: Evaluation
    seconds: float
    diverged_at: int | None = None
    score_options: dict[str, bool] = field(default_factory=dict)

    @property
    def head_scores(self) -> dict[str, np.ndarray]:
        """Every detector's (L, H) scores at the last snapshot."""
        return {name: history[-1] for name, history in self.head_history.items()}

    def next_output_uniform(self) -> float:
        """The next-output score of a head that attends evenly to every position it may
        see (causal), on the snapshot batch: the baseline a trained head should beat."""
        B = min(self.config.snapshot_batch, len(self.task.heldout_inputs))
        T = self.task.seq_len
        causal = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]  # (T, T)
        uniform = np.broadcast_to(causal, (B, 1, 1, T, T))
        return float(next_output_scores(uniform, self.task.heldout_inputs[:B],
                                        self.task.heldout_targets[:B],
                                        self.task.answer_start + 1)[0, 0])

    def phase_change_step(self) -> int | None:
        """The snapshot step where the best head's induction score rose the most (for the
        induction task), else where the held-out loss fell the most; None with < 2 snapshots."""
        if len(self.snapshot_steps) < 2:
            return None
        if self.task.name == "induction":
            curve = -self.head_history["induction"].max(axis=(1, 2))  # (K,)
        else:
            curve = self.heldout_loss
        drops = curve[:-1] - curve[1:]  # (K - 1,)
        if not np.isfinite(drops).any():
            return None
        return self.snapshot_steps[int(np.nanargmax(drops)) + 1]

    def metrics(self) -> dict[str, Any]:
        """The metrics.json content (see ``attnlab train``)."""
        final_loss = float(self.losses[-1]) if len(self.losses) else None
        finite = np.flatnonzero(np.isfinite(self.losses))
        out: dict[str, Any] = {
            "task": self.task.name,
            "task_options": self.task.options,
            "steps": self.config.steps,
            "seed": self.config.seed,
            "seconds": round(self.seconds, 3),
            "final_loss": _finite(final_loss),
            "heldout_loss": _finite(self.evaluation.loss),
            "heldout_examples": int(len(self.task.heldout_inputs)),
            "diverged_at": self.diverged_at,
            # the last step whose training loss was finite (1-based), and that loss
            "last_finite_step": int(finite[-1]) + 1 if len(finite) else None,
            "last_finite_loss": float(self.losses[finite[-1]]) if len(finite) else None,
            "model": self.model_config.to_dict(),
            "train": self.config.to_dict(),
            "parameters": int(sum(p.numel() for p in self.model.parameters())),
        }
        if self.task.name == "induction":
            out["first_half_loss"] = _finite(self.evaluation.first_half_loss)
            out["second_half_loss"] = _finite(self.evaluation.second_half_loss)
            out["period"] = self.task.period
        else:
            out["heldout_accuracy"] = self.evaluation.accuracy
        out["head_scores"] = {name: scores.tolist() for name, scores in self.head_scores.items()}
        out["head_score_options"] = self.score_options
        out["history"] = {
            "steps": list(self.snapshot_steps),
            "heldout_loss": [_finite(x) for x in self.heldout_loss],
            "head_scores": {name: history.tolist() for name, history in
                            self.head_history.items()},
        }
        if "next_output" in self.head_history:
            out["next_output_uniform"] = self.next_output_uniform()
        out["phase_change_step"] = self.phase_change_step()
        return out


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def snapshot_steps(steps: int, count: int) -> list[int]:
    """``count`` steps from 0 (before training) to ``steps``, evenly spaced, no repeats."""
    return sorted({round(i * steps / max(count - 1, 1)) for i in range(count)} | {steps})
