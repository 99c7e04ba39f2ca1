"""What ``attnlab bench`` measured, as data: one record per point, and the whole result.

The records are filled in by :mod:`attnlab.studies.bench`, turned into tables and plots
by :mod:`attnlab.studies.bench_report`, and written as ``results.json`` (schema
:data:`SCHEMA`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .measure import Timing

if TYPE_CHECKING:
    from .bench_config import BenchConfig

__all__ = ["SCHEMA", "AttentionRecord", "BenchResult", "DecodeRecord", "GenerateRecord"]

SCHEMA = "attnlab.studies.bench/1"


@dataclass
class AttentionRecord:
    """One contender at one length: throughput, peak memory, its output's difference."""

    contender: str
    T: int
    S: int
    flops: int
    timing: Timing | None = None
    peak_bytes: int | None = None  # tracemalloc (NumPy) or RSS growth (torch)
    rss_peak_bytes: int | None = None  # RSS growth, every contender
    memory_method: str | None = None
    max_abs_diff: float | None = None  # against the reference output
    error: str | None = None

    @property
    def gflops(self) -> float | None:
        return None if self.timing is None else self.flops / self.timing.median / 1e9

    def to_dict(self) -> dict[str, Any]:
        t = self.timing
        return {
            "contender": self.contender, "T": self.T, "S": self.S, "flops": self.flops,
            "gflops": self.gflops,
            "gflops_min": None if t is None else self.flops / t.max / 1e9,
            "gflops_max": None if t is None else self.flops / t.min / 1e9,
            "time": None if t is None else t.to_dict(),
            "peak_bytes": self.peak_bytes, "rss_peak_bytes": self.rss_peak_bytes,
            "memory_method": self.memory_method, "max_abs_diff": self.max_abs_diff,
            "error": self.error,
        }


@dataclass
class DecodeRecord:
    """Per-token latency at one context length, with and without the KV cache."""

    context: int
    cached: Timing  # one model step with the KV cache
    uncached: Timing  # the whole context recomputed
    attend: Timing  # KVCache.attend alone: one token of one attention layer
    max_abs_logit_diff: float

    def to_dict(self) -> dict[str, Any]:
        return {"context": self.context, "cached": self.cached.to_dict(),
                "uncached": self.uncached.to_dict(), "attend": self.attend.to_dict(),
                "speedup": self.uncached.median / self.cached.median,
                "max_abs_logit_diff": self.max_abs_logit_diff}


@dataclass
class GenerateRecord:
    """A whole generation with and without the KV cache, and whether they agree."""

    prompt_len: int
    new_tokens: int
    cached: Timing
    uncached: Timing
    same_tokens: bool
    max_abs_logit_diff: float

    @property
    def speedup(self) -> float:
        return self.uncached.median / self.cached.median

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_len": self.prompt_len, "new_tokens": self.new_tokens,
                "cached": self.cached.to_dict(), "uncached": self.uncached.to_dict(),
                "speedup": self.speedup, "same_tokens": self.same_tokens,
                "max_abs_logit_diff": self.max_abs_logit_diff}


@dataclass
class BenchResult:
    """Everything one :func:`attnlab.studies.bench.run_benchmarks` call measured."""

    config: BenchConfig
    environment: dict[str, Any]
    attention: list[AttentionRecord] = field(default_factory=list)
    decode: list[DecodeRecord] = field(default_factory=list)
    generate: GenerateRecord | None = None
    seconds: float = 0.0

    def decode_fit(self) -> dict[str, Any] | None:
        """Per-token latency against context: least-squares line and log-log slope."""
        if len(self.decode) < 2:
            return None
        contexts = np.array([r.context for r in self.decode], dtype=np.float64)
        fit: dict[str, Any] = {}
        for name in ("cached", "uncached", "attend"):
            latency = np.array([getattr(r, name).median for r in self.decode])
            slope, intercept = np.polyfit(contexts, latency, 1)
            predicted = intercept + slope * contexts
            total = float(np.sum((latency - latency.mean()) ** 2))
            r2 = 1.0 - float(np.sum((latency - predicted) ** 2)) / total if total > 0 else 1.0
            exponent = float(np.polyfit(np.log(contexts), np.log(latency), 1)[0])
            fit[name] = {"intercept_s": float(intercept), "seconds_per_context_token":
                         float(slope), "r2_linear": r2, "loglog_exponent": exponent}
        return fit

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "config": self.config.to_dict(),
            "environment": self.environment,
            "seconds": self.seconds,
            "attention": [r.to_dict() for r in self.attention],
            "decode": [r.to_dict() for r in self.decode],
            "decode_fit": self.decode_fit(),
            "generate": None if self.generate is None else self.generate.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False)
