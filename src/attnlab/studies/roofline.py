"""How close each attention path comes to this machine's limits: a roofline, measured.

Three peaks are measured first, with the same threads as the paths:

- **sgemm**: GFLOP/s of NumPy's float32 matmul, (n, n) @ (n, n), the best sample;
- **exp**: float32 exponentials per second of ``np.exp`` on a buffer that stays in cache;
- **memory bandwidth**: GB/s of ``np.copyto`` between two buffers far larger than the
  last-level cache, counted as STREAM counts a copy (bytes read + bytes written).

Each path is then timed (median of ``repeats`` interleaved samples; wall time, or
with ``cpu_time`` the process's CPU time, the steadier figure at one thread on a
machine shared with other work, which at more threads also counts threads that
spin while they wait) and given the
three lower bounds on its time that the peaks imply: FLOPs / sgemm peak,
exponentials / exp rate and compulsory bytes / bandwidth. The largest is the bound
that limits it (a roofline with an extra ceiling for exp, which attention needs
once per score), and ``share`` = that bound / the measured time: 1.0 would be a
path running at the limit. FLOPs are counted as FlashAttention's benchmarks count
them (forward 4·T·S·D per head over the pairs that may attend, backward 2.5× that);
bytes are the inputs read and outputs written once, plus the (T, S) weights written
and read back for the plain path, which builds them; a KV-cache decode step reads
the whole cache for one token, so it is bound by bandwidth.

Paths: plain ``scaled_dot_product_attention``, ``flash_attention`` forward and
backward, the torch twin (``attnlab.torch``, if torch is installed),
``flash_varlen_attention`` over packed sequences of several lengths,
``flash_attention`` with a causal sliding window, and one decoding step of
:class:`attnlab.KVCache`. Nothing here prints.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..attention import scaled_dot_product_attention
from ..fast.flash import flash_attention, flash_attention_backward
from ..fast.kv_cache import KVCache
from ..fast.varlen import cu_seqlens_from_lengths, flash_varlen_attention
from .measure import environment, interleaved, limit_threads, time_call

__all__ = ["PathRecord", "Peaks", "RooflineConfig", "RooflineResult", "measure_peaks",
           "run_roofline"]

_ITEM = 4  # float32 bytes


@dataclass(frozen=True)
class RooflineConfig:
    """Sizes of the peaks and paths; the defaults run in about 30 s on a 2-core machine."""

    threads: int = 1
    repeats: int = 5
    heads: int = 8
    head_dim: int = 64
    gemm_n: int = 1024  # sgemm peak: (n, n) @ (n, n)
    exp_elements: int = 2**16  # 256 KiB of float32: stays in L2
    copy_bytes: int = 2**27  # 128 MiB per buffer: beyond any last-level cache here
    plain_len: int = 1024  # plain sdpa, T = S
    flash_len: int = 2048  # flash forward, the torch twin, T = S
    backward_len: int = 1024  # flash backward, T = S
    varlen_lengths: tuple[int, ...] = (256, 512, 768, 1536)
    window_len: int = 4096  # sliding window: T = S, causal
    window: int = 256  # keys each query sees (itself and window - 1 before)
    decode_context: int = 16384  # tokens in the KV cache: K and V are 64 MiB at H 8, D 64
    cpu_time: bool = False  # time by the process's CPU time instead of wall time

    @classmethod
    def quick(cls, **overrides: Any) -> RooflineConfig:
        """Tiny sizes (a few seconds): for tests and a first look, not for numbers."""
        tiny: dict[str, Any] = dict(
            repeats=3, heads=2, head_dim=32, gemm_n=256, exp_elements=2**14,
            copy_bytes=2**22, plain_len=128, flash_len=128, backward_len=128,
            varlen_lengths=(32, 64, 96), window_len=256, window=32, decode_context=512)
        tiny.update(overrides)
        return cls(**tiny)


@dataclass(frozen=True)
class Peaks:
    """This machine's measured limits, at the configured threads."""

    gemm_gflops: float  # float32 matmul
    exp_per_second: float  # float32 np.exp
    bandwidth_gbs: float  # np.copyto, read + write


@dataclass
class PathRecord:
    """One path's work, measured time and share of the bound that limits it."""

    name: str
    size: str
    flops: float
    exps: float
    bytes: float
    seconds: float  # median
    seconds_min: float
    seconds_max: float
    bounds: dict[str, float] = field(default_factory=dict)  # lower bounds (s) per limit
    limit: str = ""  # "sgemm", "exp" or "memory"
    share: float = 0.0  # bound / measured time

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9

    @property
    def gbs(self) -> float:
        return self.bytes / self.seconds / 1e9

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per compulsory byte."""
        return self.flops / self.bytes


@dataclass
class RooflineResult:
    config: RooflineConfig
    peaks: Peaks
    paths: list[PathRecord]
    environment: dict[str, Any]
    load_average: tuple[float, float, float] | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        paths = [{**asdict(p), "gflops": p.gflops, "gbs": p.gbs, "intensity": p.intensity}
                 for p in self.paths]
        return {"config": asdict(self.config), "peaks": asdict(self.peaks), "paths": paths,
                "environment": self.environment, "load_average": self.load_average,
                "seconds": self.seconds}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _clock(config: RooflineConfig) -> Callable[[], float]:
    return time.process_time if config.cpu_time else time.perf_counter


def _best_rate(fn: Callable[[], Any], work: float, config: RooflineConfig) -> float:
    """work / the fastest of ``repeats`` samples of ``fn`` (a peak: the best the machine
    does, not the typical)."""
    fn()
    return work / min(time_call(fn, clock=_clock(config)) for _ in range(max(config.repeats, 3)))


def measure_peaks(config: RooflineConfig) -> Peaks:
    """sgemm GFLOP/s, exp per second and copy bandwidth (GB/s), in the caller's threads."""
    rng = np.random.default_rng(0)
    n = config.gemm_n
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    product = np.empty((n, n), dtype=np.float32)
    gemm = _best_rate(lambda: np.matmul(a, b, out=product), 2.0 * n**3, config)
    x = rng.uniform(-10.0, 0.0, config.exp_elements).astype(np.float32)
    y = np.empty_like(x)
    # Many calls per sample: one call on a cached buffer is only microseconds.
    calls = max(1, 2**22 // config.exp_elements)
    exp_rate = _best_rate(lambda: [np.exp(x, out=y) for _ in range(calls)],
                          float(calls * x.size), config)
    count = config.copy_bytes // _ITEM
    src = np.ones(count, dtype=np.float32)
    dst = np.zeros(count, dtype=np.float32)
    bandwidth = _best_rate(lambda: np.copyto(dst, src), 2.0 * count * _ITEM, config)
    return Peaks(gemm / 1e9, exp_rate, bandwidth / 1e9)


@dataclass
class _Path:
    name: str
    size: str
    flops: float
    exps: float
    bytes: float
    call: Callable[[], Any]


def _paths(config: RooflineConfig) -> list[_Path]:
    rng = np.random.default_rng(1)
    H, D = config.heads, config.head_dim
    # One thread: BLAS is already held to one by run_roofline, and flash's own pool
    # (through threadpoolctl, a few ms a call) would only add overhead.
    threads = config.threads if config.threads > 1 else None

    def normal(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    paths = []
    T = config.plain_len
    q, k, v = (normal(1, H, T, D) for _ in range(3))
    paths.append(_Path(
        "sdpa (plain)", f"H{H} T=S={T} D{D}", 4.0 * H * T * T * D, H * T * T,
        (4 * H * T * D + 2 * H * T * T) * _ITEM,
        partial(scaled_dot_product_attention, q, k, v)))

    T = config.flash_len
    q, k, v = (normal(1, H, T, D) for _ in range(3))
    paths.append(_Path(
        "flash forward", f"H{H} T=S={T} D{D}", 4.0 * H * T * T * D, H * T * T,
        4 * H * T * D * _ITEM + 8 * H * T,
        partial(flash_attention, q, k, v, num_threads=threads)))
    try:
        import torch

        from ..torch import scaled_dot_product_attention as torch_sdpa
    except ImportError:
        pass
    else:
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

        def twin(tq: Any = tq, tk: Any = tk, tv: Any = tv) -> Any:
            with torch.inference_mode():
                return torch_sdpa(tq, tk, tv)

        paths.append(_Path("torch twin (attnlab.torch)", f"H{H} T=S={T} D{D}",
                           4.0 * H * T * T * D, H * T * T, 4 * H * T * D * _ITEM, twin))

    T = config.backward_len
    q, k, v, dout = (normal(1, H, T, D) for _ in range(4))
    out, lse = flash_attention(q, k, v, return_lse=True)
    paths.append(_Path(
        "flash backward", f"H{H} T=S={T} D{D}", 2.5 * 4.0 * H * T * T * D, H * T * T,
        8 * H * T * D * _ITEM + 8 * H * T,
        partial(flash_attention_backward, q, k, v, out, lse, dout, num_threads=threads)))

    lengths = config.varlen_lengths
    total = sum(lengths)
    cu = cu_seqlens_from_lengths(lengths)
    pairs = float(sum(n * n for n in lengths))
    vq, vk, vv = (normal(total, H, D) for _ in range(3))
    paths.append(_Path(
        "flash varlen", f"H{H} lengths {'+'.join(map(str, lengths))} D{D}",
        4.0 * H * pairs * D, H * pairs, 4 * H * total * D * _ITEM,
        partial(flash_varlen_attention, vq, vk, vv, cu, cu, max(lengths), max(lengths))))

    T, W = config.window_len, config.window
    pairs = float(sum(min(i + 1, W) for i in range(T)))
    q, k, v = (normal(1, H, T, D) for _ in range(3))
    paths.append(_Path(
        "sliding window", f"H{H} T=S={T} W={W} D{D}", 4.0 * H * pairs * D, H * pairs,
        4 * H * T * D * _ITEM,
        partial(flash_attention, q, k, v, is_causal=True, window=(W - 1, 0),
                num_threads=threads)))

    S = config.decode_context
    cache = KVCache(1, H, D, capacity=S + config.repeats + 4, dtype=np.float32)
    cache.append(normal(1, H, S, D), normal(1, H, S, D))
    token = [normal(1, H, 1, D) for _ in range(3)]
    paths.append(_Path(
        "KV-cache decode step", f"H{H} context {S} D{D}", 4.0 * H * S * D, H * S,
        2 * H * S * D * _ITEM, partial(cache.attend, *token)))
    return paths


def run_roofline(config: RooflineConfig | None = None) -> RooflineResult:
    """Measure the peaks, then every path, in ``config.threads`` threads (NumPy's BLAS,
    flash's ``num_threads`` and torch's intra-op pool alike)."""
    config = RooflineConfig() if config is None else config
    start = time.perf_counter()
    with limit_threads(config.threads, torch=True, feature="attnlab bench --roofline"):
        peaks = measure_peaks(config)
        paths = _paths(config)
        for path in paths:
            path.call()  # warm-up; the decode step appends a token, as every call does
        # min_time 0: each sample is one call (a decode step appends one token per call).
        timings = interleaved({p.name: p.call for p in paths}, config.repeats,
                              clock=_clock(config))
    records = []
    for p in paths:
        t = timings[p.name]
        bounds = {"sgemm": p.flops / (peaks.gemm_gflops * 1e9),
                  "exp": p.exps / peaks.exp_per_second,
                  "memory": p.bytes / (peaks.bandwidth_gbs * 1e9)}
        limit = max(bounds, key=lambda name: bounds[name])
        records.append(PathRecord(p.name, p.size, p.flops, p.exps, p.bytes, t.median, t.min,
                                  t.max, bounds, limit, bounds[limit] / t.median))
    try:
        load = os.getloadavg()
    except (AttributeError, OSError):
        load = None
    return RooflineResult(config, peaks, records, environment(config.threads), load,
                          time.perf_counter() - start)
