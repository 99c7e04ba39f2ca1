"""The seeds' training claims, measured with :mod:`attnlab.train` on small CPU-sized runs.

``scaling``
    "1/√d_k keeps the softmax out of saturation, so gradients keep flowing": sort
    (6 digits of 10), 2 layers, 2 heads, E = 64, head dim d_k in {16, 64, 256}, with
    and without the scaling. Measured: the steps until the training loss (an
    exponential average, factor 0.9) first falls below ``SCALING_TARGET``, or None
    when it never does within the budget; and the held-out exact match at the end.
``norm``
    "Pre-LN trains more stably than Post-LN": sort, E = 32, 2 heads, 2 / 6 / 12 layers,
    Pre-LN and Post-LN, with and without a linear warm-up, at a high learning rate
    (``NORM_LR``). A run *fails* when the loss stops being finite or when the mean
    training loss over its last tenth is above half the loss at the first step
    (the model learned next to nothing). Measured: the share of seeds that fail.
``positions``
    "Without position information attention cannot see order": reverse (6 digits of
    10), learned / sinusoidal / RoPE / no positions. Measured: held-out exact match.

Every run is seeded (seeds 0 .. seeds-1) and deterministic; the CLI prints the
table and writes the raw numbers (``attnlab train --study NAME``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..checks import check_positive_int
from ..errors import AttnlabError

__all__ = ["STUDIES", "SCALING_TARGET", "NORM_LR", "run_study", "study_table", "plan"]

STUDIES = ("scaling", "norm", "positions")
SCALING_TARGET = 0.1
"""The training loss (smoothed) that ``scaling`` counts the steps to."""
NORM_LR = 3e-3
"""The learning rate of ``norm``: high enough that the placement of LayerNorm matters."""

_SCALING_STEPS = 600
_NORM_STEPS = 200
_POSITION_STEPS = 800


def plan(study: str) -> list[dict[str, Any]]:
    """The settings of ``study``: one dict per configuration (seeds come on top)."""
    if study == "scaling":
        return [{"head_dim": d, "scale": scale} for d in (16, 64, 256)
                for scale in (True, False)]
    if study == "norm":
        return [{"num_layers": n, "norm": norm, "warmup": warmup} for n in (2, 6, 12)
                for norm in ("pre", "post") for warmup in (0, 100)]
    if study == "positions":
        return [{"pos": p} for p in ("none", "learned", "sinusoidal", "rope")]
    raise AttnlabError(f"study: expected one of {', '.join(STUDIES)}, got {study!r}")


def _one(study: str, setting: dict[str, Any], seed: int) -> dict[str, Any]:
    from ..train import DecoderConfig, TrainConfig, train
    from ..train.tasks import make_task

    if study == "scaling":
        task = make_task("sort", seed=seed, heldout=1000)
        model = DecoderConfig(task.vocab_size, task.seq_len, d_model=64, num_heads=2,
                            head_dim=setting["head_dim"], scale=setting["scale"])
        config = TrainConfig(steps=_SCALING_STEPS, lr=1e-3, warmup=50, seed=seed, snapshots=2)
    elif study == "norm":
        task = make_task("sort", seed=seed, heldout=1000)
        model = DecoderConfig(task.vocab_size, task.seq_len, d_model=32, num_heads=2,
                            num_layers=setting["num_layers"], norm=setting["norm"])
        config = TrainConfig(steps=_NORM_STEPS, lr=NORM_LR, warmup=setting["warmup"],
                             seed=seed, snapshots=2, grad_clip=None)
    else:
        task = make_task("reverse", seed=seed, heldout=1000)
        model = DecoderConfig(task.vocab_size, task.seq_len, pos=setting["pos"])
        config = TrainConfig(steps=_POSITION_STEPS, lr=3e-3, warmup=100, seed=seed,
                             snapshots=2)
    result = train(task, model, config)
    losses = result.losses
    record: dict[str, Any] = {**setting, "seed": seed, "seconds": round(result.seconds, 2),
                              "diverged_at": result.diverged_at,
                              "heldout_accuracy": result.evaluation.accuracy,
                              "first_loss": float(losses[0]) if len(losses) else None}
    finite = losses[np.isfinite(losses)]
    tail = finite[-max(len(losses) // 10, 1):] if len(finite) else finite
    record["final_loss"] = float(tail.mean()) if len(tail) else None
    if study == "scaling":
        smooth, reached = losses[0], None
        for step, value in enumerate(losses, start=1):
            smooth = 0.9 * smooth + 0.1 * value
            if smooth < SCALING_TARGET:
                reached = step
                break
        record["steps_to_target"] = reached
    if study == "norm":
        record["failed"] = bool(result.diverged_at is not None or record["final_loss"] is None
                                or record["final_loss"] > 0.5 * record["first_loss"])
    return record


def run_study(
    study: str, *, seeds: int = 3, on_run: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """Every setting of ``study`` at seeds 0 .. seeds-1: {"study", "seeds", "runs": [...],
    "seconds"}; ``on_run(done, total)`` after each run."""
    settings = plan(study)
    seeds = check_positive_int(seeds, "seeds")
    start = time.perf_counter()
    runs = []
    total = len(settings) * seeds
    for setting in settings:
        for seed in range(seeds):
            runs.append(_one(study, setting, seed))
            if on_run is not None:
                on_run(len(runs), total)
    return {"study": study, "seeds": seeds, "runs": runs,
            "seconds": round(time.perf_counter() - start, 1)}


def _group(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[Any, ...], list[Any]]:
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for run in runs:
        groups.setdefault(tuple(run[k] for k in keys), []).append(run)
    return groups


def _mean(values: list[float | None]) -> str:
    real = [v for v in values if v is not None and math.isfinite(v)]
    return "–" if not real else f"{sum(real) / len(real):.3f}"


def study_table(results: dict[str, Any], lang: str = "en") -> str:
    """The study as a Markdown table (English or Chinese headers), one row per setting."""
    zh = lang == "zh"
    study, runs, seeds = results["study"], results["runs"], results["seeds"]
    rows: list[str] = []
    if study == "scaling":
        head = ("| d_k | 1/√d_k | 到达损失 0.1 的步数（各种子） | 留出集正确率（均值） |" if zh else
                "| d_k | 1/√d_k | steps to loss 0.1 (per seed) | held-out exact match (mean) |")
        rows = [head, "|---|---|---|---|"]
        for (d, scale), group in _group(runs, ("head_dim", "scale")).items():
            reached = ", ".join("—" if r["steps_to_target"] is None else str(r["steps_to_target"])
                                for r in group)
            on = ("是" if scale else "否") if zh else ("yes" if scale else "no")
            accuracy = _mean([r["heldout_accuracy"] for r in group])
            rows.append(f"| {d} | {on} | {reached} | {accuracy} |")
        note = (f"（— = {_SCALING_STEPS} 步内未到达）" if zh
                else f"(— = not reached in {_SCALING_STEPS} steps)")
    elif study == "norm":
        head = ("| 层数 | LayerNorm | 预热 | 失败的种子 | 最终损失（均值） |" if zh else
                "| layers | LayerNorm | warm-up | seeds that failed | final loss (mean) |")
        rows = [head, "|---|---|---|---|---|"]
        for (n, norm, warmup), group in _group(runs, ("num_layers", "norm", "warmup")).items():
            failed = sum(r["failed"] for r in group)
            rows.append(f"| {n} | {norm}-LN | {warmup} | {failed}/{len(group)} | "
                        f"{_mean([r['final_loss'] for r in group])} |")
        note = (f"（学习率 {NORM_LR}，{_NORM_STEPS} 步；失败 = 损失发散，或最后十分之一的"
                "平均损失高于第一步的一半）" if zh else
                f"(lr {NORM_LR}, {_NORM_STEPS} steps; failed = the loss diverged, or its mean "
                "over the last tenth stayed above half the first step's)")
    else:
        head = ("| 位置信息 | 留出集完全正确率（各种子） |" if zh else
                "| positions | held-out exact match (per seed) |")
        rows = [head, "|---|---|"]
        for (pos,), group in _group(runs, ("pos",)).items():
            rows.append(f"| {pos} | "
                        + ", ".join(f"{r['heldout_accuracy']:.3f}" for r in group) + " |")
        note = f"（reverse，{_POSITION_STEPS} 步）" if zh else f"(reverse, {_POSITION_STEPS} steps)"
    rows.append("")
    rows.append(note + (f" {seeds} 个种子，{results['seconds']} 秒" if zh
                        else f" {seeds} seeds, {results['seconds']} s"))
    return "\n".join(rows)
