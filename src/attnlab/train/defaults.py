"""The settings ``attnlab train TASK`` starts from, per task, chosen by measurement on a
2-core CPU (docs/training.md and docs/measurements.md give the commands and the
numbers):

- sort, reverse, copy: 2 layers, 4 heads, E = 64, learned positions, 1000 steps of
  64 examples at lr 3e-3 (100 warm-up steps). Sort reaches exact match on all 5000
  held-out examples.
- induction: 2 layers, 4 heads, E = 64, attention only, RoPE, 800 steps. With learned
  absolute positions the same model had not formed the previous-token / induction
  pair after 1500 steps; with RoPE both form around step 350.
- modadd: 1 layer, full batches of the training pairs with weight decay 1 (the
  grokking set-up, with p = 23 to fit a CPU).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULTS", "defaults_for"]

_SEQUENCE: dict[str, dict[str, Any]] = {
    "model": {"d_model": 64, "num_heads": 4, "num_layers": 2, "pos": "learned"},
    "train": {"steps": 1000, "batch_size": 64, "lr": 3e-3, "warmup": 100},
}

#: task name -> {"model": DecoderConfig options, "train": TrainConfig options}
DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "sort": _SEQUENCE,
    "reverse": _SEQUENCE,
    "copy": _SEQUENCE,
    "induction": {
        "model": {"d_model": 64, "num_heads": 4, "num_layers": 2, "attn_only": True,
                  "pos": "rope"},
        "train": {"steps": 800, "batch_size": 64, "lr": 3e-3, "warmup": 100},
    },
    "modadd": {
        "model": {"d_model": 64, "num_heads": 4, "num_layers": 1, "pos": "learned"},
        "train": {"steps": 3000, "batch_size": 264, "lr": 3e-3, "warmup": 100,
                  "weight_decay": 1.0},
    },
}


def defaults_for(task: str) -> dict[str, dict[str, Any]]:
    """A copy of :data:`DEFAULTS` for ``task`` (KeyError for an unknown task)."""
    chosen = DEFAULTS[task]
    return {"model": dict(chosen["model"]), "train": dict(chosen["train"])}
