"""Watch attention learn: synthetic tasks (:mod:`attnlab.train.tasks`), a small causal
decoder on attnlab.torch, a seeded trainer, attention snapshots scored by the
:mod:`attnlab.lens.heads` detectors, and head ablation during evaluation.

    from attnlab.train import DecoderConfig, TrainConfig, train
    from attnlab.train.tasks import make_task
    task = make_task("induction")
    result = train(task, DecoderConfig(task.vocab_size, task.seq_len, attn_only=True),
                   TrainConfig(steps=300))
    result.head_scores["induction"]      # (L, H)

:mod:`attnlab.train.tasks` is NumPy only and imports without torch; the names of this
package need torch (without it, using one raises an ImportError that says how to
install it).
"""

from __future__ import annotations

from typing import Any

from ..errors import missing_extra

try:
    import torch  # noqa: F401
except ImportError:  # attnlab.train.tasks still imports; the names below raise on use
    pass
else:
    from .defaults import DEFAULTS, defaults_for
    from .model import POSITIONS, Decoder, DecoderConfig
    from .trainer import (
        Evaluation,
        TrainConfig,
        TrainResult,
        ablation_check,
        evaluate,
        next_output_scores,
        snapshot_steps,
        train,
    )

__all__ = [
    "DEFAULTS",
    "POSITIONS",
    "Decoder",
    "Evaluation",
    "DecoderConfig",
    "TrainConfig",
    "TrainResult",
    "ablation_check",
    "defaults_for",
    "evaluate",
    "next_output_scores",
    "snapshot_steps",
    "train",
]


def __getattr__(name: str) -> Any:
    """``ModelConfig``: the former name of :class:`DecoderConfig` (deprecated, warns).
    Without torch, every name of ``__all__`` raises the ImportError that says how to
    install it (``attnlab.train.tasks`` needs no torch, so the package imports)."""
    if name == "ModelConfig" and "DecoderConfig" in globals():
        from . import model

        return model.ModelConfig
    if name in __all__ or name == "ModelConfig":
        raise missing_extra("torch", "torch", "attnlab.train")
    raise AttributeError(f"module 'attnlab.train' has no attribute {name!r}")
