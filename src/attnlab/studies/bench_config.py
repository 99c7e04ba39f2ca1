"""What ``attnlab bench`` runs: the sections, the contenders, and their sizes and method.

:meth:`BenchConfig.quick` is a configuration that finishes in well under a minute;
``attnlab bench`` builds one from its options. The suite itself is
:mod:`attnlab.studies.bench`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import check_positive_int
from ..errors import AttnlabError
from ..nn.decoder import DecoderConfig

__all__ = ["CONTENDERS", "SECTIONS", "BenchConfig"]

CONTENDERS = ("numpy_naive", "numpy_flash", "torch_naive", "torch_sdpa", "attnlab_torch")
SECTIONS = ("attention", "decode", "generate")


@dataclass(frozen=True)
class BenchConfig:
    """What to run. :meth:`quick` is a configuration that finishes in well under a minute."""

    sections: tuple[str, ...] = SECTIONS
    # attention
    lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096)
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    causal: bool = False
    dtype: str = "float32"
    contenders: tuple[str, ...] = CONTENDERS
    max_memory: float = 4.0  # GiB the naive contenders' score matrices may take
    # method
    repeats: int = 5
    min_time: float = 0.05  # seconds a sample should last (fast calls are looped)
    threads: int = 1
    measure_memory: bool = True
    seed: int = 0
    # decode / generate
    model: DecoderConfig = field(default_factory=DecoderConfig)
    contexts: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    prompt_len: int = 512
    new_tokens: int = 512
    generate_repeats: int = 3

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "head_dim", "repeats", "threads", "prompt_len",
                     "generate_repeats"):
            check_positive_int(getattr(self, name), name)
        check_positive_int(self.new_tokens, "new_tokens", allow_zero=True)
        check_positive_int(self.seed, "seed", allow_zero=True)
        _check_names(self.sections, SECTIONS, "sections")
        _check_names(self.contenders, CONTENDERS, "contenders")
        for name in ("lengths", "contexts"):
            values = getattr(self, name)
            if not values:
                raise AttnlabError(f"{name}: expected at least one length, got none")
            for value in values:
                check_positive_int(value, name)
        if self.dtype not in ("float32", "float64"):
            raise AttnlabError(f"dtype: expected 'float32' or 'float64', got {self.dtype!r}")
        for name in ("min_time", "max_memory"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                0 <= value < math.inf
            ):
                raise AttnlabError(f"{name}: expected a finite number >= 0, got {value!r}")
        if not isinstance(self.model, DecoderConfig):
            raise AttnlabError(f"model: expected a DecoderConfig, got {type(self.model).__name__}")

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """Small sizes, every section and contender: checks the pipeline in seconds."""
        base: dict[str, Any] = dict(
            lengths=(128, 256, 512), heads=4, head_dim=64, min_time=0.01,
            contexts=(64, 128, 256, 512), prompt_len=64, new_tokens=64, generate_repeats=5,
        )
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _check_names(values: Sequence[str], allowed: Sequence[str], name: str) -> None:
    if not values:
        raise AttnlabError(f"{name}: expected at least one of {', '.join(allowed)}, got none")
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise AttnlabError(
            f"{name}: expected names from {', '.join(allowed)}, got {', '.join(map(str, unknown))}"
        )
