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

What a run records is defined in :mod:`attnlab.train.results`; the held-out
evaluation and the ablations in :mod:`attnlab.train.evaluation`. This module
exports their names too.

Dimension legend: K snapshots, L layers, H heads, T tokens, V vocabulary size.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import AttnlabError
from ..lens.heads import DETECTORS, all_head_scores
from .evaluation import INDUCTION_HEAD_SCORE, ablation_check, evaluate
from .model import Decoder, DecoderConfig
from .results import (
    GENERIC_DETECTORS_APPLY,
    TASK_DETECTORS,
    Evaluation,
    TrainConfig,
    TrainResult,
    next_output_scores,
    snapshot_steps,
)
from .tasks import IGNORE, Task

__all__ = ["TrainConfig", "TrainResult", "Evaluation", "train", "evaluate", "snapshot_steps",
           "ablation_check", "next_output_scores", "INDUCTION_HEAD_SCORE", "TASK_DETECTORS",
           "GENERIC_DETECTORS_APPLY"]

StepCallback = Callable[[int, int, float], None]


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
    model_config: DecoderConfig,
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
