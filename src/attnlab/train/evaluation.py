"""The trained model on its task's held-out split: :func:`evaluate` (loss, exact-match
accuracy, loss by position, with chosen heads zero- or mean-ablated) and
:func:`ablation_check` (what the heads of an induction run do, by taking them out).

Dimension legend: N held-out examples, L layers, H heads, T tokens, V vocabulary size.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..checks import check_positive_int
from ..errors import AttnlabError
from .model import AblationMode, Decoder
from .results import Evaluation, TrainResult
from .tasks import IGNORE, Task

__all__ = ["INDUCTION_HEAD_SCORE", "ablation_check", "evaluate"]


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
