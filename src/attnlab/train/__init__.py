"""Watch attention learn: a small causal decoder on attnlab.torch, a seeded trainer for
:mod:`attnlab.tasks`, attention snapshots scored by the :mod:`attnlab.lens.heads`
detectors, and head ablation during evaluation. Needs torch.

    from attnlab.tasks import make_task
    from attnlab.train import ModelConfig, TrainConfig, train
    task = make_task("induction")
    result = train(task, ModelConfig(task.vocab_size, task.seq_len, attn_only=True),
                   TrainConfig(steps=300))
    result.head_scores["induction"]      # (L, H)
"""

from ..errors import missing_extra

try:
    import torch  # noqa: F401
except ImportError:
    raise missing_extra("torch", "torch", "attnlab.train") from None

from .defaults import DEFAULTS, defaults_for
from .model import POSITIONS, Decoder, ModelConfig
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
    "ModelConfig",
    "TrainConfig",
    "TrainResult",
    "ablation_check",
    "defaults_for",
    "evaluate",
    "next_output_scores",
    "snapshot_steps",
    "train",
]
