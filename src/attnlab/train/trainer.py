"""A small, seeded, deterministic trainer for :mod:`attnlab.train.tasks` on :class:`Decoder`.

One seed fixes everything: the initial weights (a torch.Generator), the training
batches (a NumPy Generator) and the held-out split (the task's own seed). On the
CPU, with the same torch thread count, two runs give the same numbers bit for bit.

    AdamW(lr, weight_decay), linear warm-up over ``warmup`` steps, then cosine decay
    to lr / 10 at the last step; gradients clipped to norm ``grad_clip``;
    cross-entropy over the scored positions (targets != IGNORE).

At the chosen snapshot steps (before the first update, then evenly spaced, and the
last) the model runs on a fixed held-out batch: the weights of its first example
are kept, and every head is scored by the :mod:`attnlab.lens.heads` detectors over
the whole batch. The library never prints: ``on_step(step, steps, loss)`` is called
after every update, and the command line draws its progress bar from it.

Dimension legend: K snapshots, L layers, H heads, T tokens, V vocabulary size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import AttnlabError, check_positive_int
from ..lens.heads import DETECTORS, all_head_scores
from ..messages import msg
from .model import AblationMode, Decoder, ModelConfig
from .tasks import IGNORE, Task

__all__ = ["TrainConfig", "TrainResult", "Evaluation", "train", "evaluate", "snapshot_steps",
           "ablation_check", "next_output_scores", "INDUCTION_HEAD_SCORE", "TASK_DETECTORS",
           "GENERIC_DETECTORS_APPLY"]

StepCallback = Callable[[int, int, float], None]

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
    model_config: ModelConfig
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


def _learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay from lr to lr / 10 (step counts from 0)."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    span = max(config.steps - config.warmup, 1)
    progress = min((step - config.warmup) / span, 1.0)
    return config.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # (B, T, V), (B, T) -> ()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE)


def train(
    task: Task,
    model_config: ModelConfig,
    config: TrainConfig | None = None,
    *,
    on_step: StepCallback | None = None,
) -> TrainResult:
    """Train a :class:`Decoder` of ``model_config`` on ``task``; see the module doc.

    Training stops early, without raising, when it diverges: when the training loss
    stops being finite, or an update leaves the weights inf/NaN (seen at the next
    snapshot). ``diverged_at`` is that step (1-based); ``losses`` ends there, and
    ``metrics()`` gives ``last_finite_step`` and ``last_finite_loss``.
    """
    config = config or TrainConfig()
    if not isinstance(task, Task):
        raise AttnlabError(f"task: expected an attnlab.train.tasks.Task, "
                           f"got {type(task).__name__}")
    if model_config.vocab_size != task.vocab_size or model_config.max_len < task.seq_len:
        raise AttnlabError(
            f"model_config: expected vocab_size = {task.vocab_size} and max_len >= "
            f"{task.seq_len} for {task.name}, got {model_config.vocab_size} and "
            f"{model_config.max_len}")
    start = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    model = Decoder(model_config, seed=config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay)
    snap_ids = torch.from_numpy(task.heldout_inputs[: config.snapshot_batch])  # (B, T)
    snap_targets = torch.from_numpy(task.heldout_targets[: config.snapshot_batch])
    wanted = set(snapshot_steps(config.steps, config.snapshots))
    exclude_bos = task.name == "induction"
    taken: list[int] = []
    frames: list[np.ndarray] = []
    task_detectors = TASK_DETECTORS.get(task.name, ())
    history: dict[str, list[np.ndarray]] = {name: [] for name in (*task_detectors, *DETECTORS)}
    heldout_loss: list[float] = []

    def snapshot(step: int) -> bool:
        """Record the held-out batch at ``step``; False (nothing recorded) when the
        weights are no longer finite (the run diverged)."""
        model.eval()
        with torch.no_grad():
            logits, weights = model(snap_ids, return_weights=True)  # (B, L, H, T, T)
            loss = float(_loss(logits, snap_targets))
        model.train()
        if not (math.isfinite(loss) and bool(torch.isfinite(weights).all())):
            return False
        heldout_loss.append(loss)
        w = weights.numpy()
        frames.append(w[0].astype(np.float32))
        for name, scores in all_head_scores(w, task.heldout_inputs[: len(w)],
                                            exclude_bos=exclude_bos).items():
            history[name].append(scores)
        if "next_output" in task_detectors:
            history["next_output"].append(next_output_scores(
                w, task.heldout_inputs[: len(w)], snap_targets.numpy()[: len(w)],
                task.answer_start + 1))
        taken.append(step)
        return True

    losses = np.full(config.steps, np.nan)
    diverged_at = None
    if 0 in wanted:
        snapshot(0)
    for step in range(config.steps):
        inputs, targets = task.batch(rng, config.batch_size)
        for group in optimizer.param_groups:
            group["lr"] = _learning_rate(config, step)
        logits = model(torch.from_numpy(inputs))
        loss = _loss(logits, torch.from_numpy(targets))
        value = float(loss.detach())
        losses[step] = value
        if not math.isfinite(value):
            diverged_at = step + 1
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        if on_step is not None:
            on_step(step + 1, config.steps, value)
        if step + 1 in wanted and not snapshot(step + 1):
            diverged_at = step + 1  # a finite loss, but the update made the weights inf/NaN
            break
    losses = losses[: (diverged_at or config.steps)]
    model.eval()
    evaluation = evaluate(model, task, batch=config.eval_batch)
    return TrainResult(
        task=task, model_config=model_config, config=config, model=model, losses=losses,
        snapshot_steps=taken,
        snapshots=np.stack(frames) if frames else np.zeros((0,)),
        snapshot_tokens=task.heldout_inputs[0].copy(),
        head_history={name: np.stack(h) if h else np.zeros((0,)) for name, h in history.items()},
        heldout_loss=np.array(heldout_loss), evaluation=evaluation,
        seconds=time.perf_counter() - start, diverged_at=diverged_at,
        score_options={"exclude_bos": exclude_bos, "exclude_current_token": False},
    )


def evaluate(
    model: Decoder,
    task: Task,
    *,
    ablate: Sequence[tuple[int, int]] = (),
    mode: AblationMode = "zero",
    batch: int = 1000,
) -> Evaluation:
    """The model on the whole held-out split, with the ``ablate`` (layer, head) pairs
    zero- or mean-ablated (the means over the held-out split itself)."""
    batch = check_positive_int(batch, "batch")
    inputs = torch.from_numpy(task.heldout_inputs)  # (N, T)
    targets = torch.from_numpy(task.heldout_targets)  # (N, T)
    scored = targets != IGNORE  # (N, T)
    was_training = model.training
    model.eval()
    total = torch.zeros(task.seq_len, dtype=torch.float64)  # (T,)
    correct = torch.zeros(len(inputs), dtype=torch.bool)  # (N,)
    try:
        with torch.no_grad(), model.ablate(ablate, mode, reference=inputs if ablate and
                                           mode == "mean" else None, name="ablate"):
            for first in range(0, len(inputs), batch):
                ids, tgt = inputs[first:first + batch], targets[first:first + batch]
                logits = model(ids)  # (b, T, V)
                nll = F.cross_entropy(logits.transpose(1, 2), tgt.clamp(min=0),
                                      reduction="none")  # (b, T)
                keep = scored[first:first + batch]
                total += torch.where(keep, nll, 0.0).sum(dim=0).double()
                right = (logits.argmax(dim=-1) == tgt) | ~keep  # (b, T)
                correct[first:first + batch] = right.all(dim=1)
    finally:
        model.train(was_training)
    counts = scored.sum(dim=0).double()  # (T,)
    position_loss = torch.where(counts > 0, total / counts.clamp(min=1), float("nan")).numpy()
    loss = float(total.sum() / counts.sum())
    first_half = second_half = None
    if task.period is not None:  # predicting the first copy (random) vs the repeat
        n = task.period
        first_half = float(np.mean(position_loss[: n - 1]))
        second_half = float(np.mean(position_loss[n:]))
    return Evaluation(loss=loss, accuracy=float(correct.double().mean()),
                      position_loss=position_loss, first_half_loss=first_half,
                      second_half_loss=second_half)


INDUCTION_HEAD_SCORE = 0.4
"""A head of a later layer whose induction score is above this counts as an induction head."""


def ablation_check(result: TrainResult) -> dict[str, Any]:
    """What the heads of an induction run do, by taking them out on the held-out split.

    Reported as the held-out loss on the repeat (``second_half_loss``; the first
    copy's loss, which no head can lower, is in ``none``):

    - ``per_head``: each head alone, zero- and mean-ablated, (L, H) each;
    - ``induction_heads``: the heads after the first layer whose induction score is
      above :data:`INDUCTION_HEAD_SCORE`, ablated together;
    - ``other_heads``: every head that is neither one of those nor the best
      previous-token head of the first layer, ablated together (the control).

    Layers and heads are 0-based. Only for tasks with a period (induction).
    """
    task = result.task
    if task.period is None:
        raise AttnlabError(f"result: expected a run on the induction task, got {task.name}")
    induction = result.head_scores["induction"]  # (L, H)
    previous = result.head_scores["previous_token"]  # (L, H)
    L, H = induction.shape
    first = 1 if L > 1 else 0
    heads = [(layer, head) for layer in range(first, L) for head in range(H)
             if induction[layer, head] > INDUCTION_HEAD_SCORE]
    feeding = (0, int(np.argmax(previous[0])))
    others = [(layer, head) for layer in range(L) for head in range(H)
              if (layer, head) not in heads and (layer, head) != feeding]
    plain = evaluate(result.model, task)

    def repeat_loss(chosen: list[tuple[int, int]], mode: AblationMode) -> float | None:
        if not chosen:
            return None
        return evaluate(result.model, task, ablate=chosen, mode=mode).second_half_loss

    per_head = {mode: [[repeat_loss([(layer, head)], mode) for head in range(H)]
                       for layer in range(L)] for mode in ("zero", "mean")}
    return {
        "none": {"first_half_loss": plain.first_half_loss,
                 "second_half_loss": plain.second_half_loss},
        "induction_head_score": INDUCTION_HEAD_SCORE,
        "induction_heads": [list(pair) for pair in heads],
        "previous_token_head": list(feeding),
        "other_heads": [list(pair) for pair in others],
        "induction_heads_ablated": {mode: repeat_loss(heads, mode) for mode in ("zero", "mean")},
        "other_heads_ablated": {mode: repeat_loss(others, mode) for mode in ("zero", "mean")},
        "per_head": per_head,
    }
