"""The benchmark suite behind ``attnlab bench``: attention throughput and memory, decoding.

Dimension legend: B batch, H heads, T query length, S key length, D head dim.

Three sections, each optional:

``attention``
    One attention forward, q, k, v of shape (B, H, T, D) with T = S, for each
    contender and length: throughput in GFLOP/s, with the forward counted as
    ``4·B·H·T·S·D`` FLOPs (two matrix products), half of that when causal;
    and peak extra memory. Contenders: ``numpy_naive``
    (:func:`attnlab.scaled_dot_product_attention`), ``numpy_flash``
    (:func:`attnlab.fast.flash.flash_attention`), ``torch_naive`` (explicit
    ``softmax(Q Kᵀ · scale) V``), ``torch_sdpa``
    (``torch.nn.functional.scaled_dot_product_attention``) and ``attnlab_torch``
    (:func:`attnlab.torch.scaled_dot_product_attention`). Torch runs under
    ``torch.inference_mode()``. Every contender's output is compared with a
    reference before anything is timed (``max_abs_diff`` in the results).
``decode``
    Latency of one decoding step of :class:`attnlab.nn.decoder.TinyDecoder` at each
    context length, with the KV cache (one new token against S cached ones) and
    without (the whole S + 1 tokens recomputed, which is what uncached
    generation does at every step). The tiny model's step has a fixed cost of
    about a millisecond (Python and small matrix products) that hides the O(S)
    part, so the section also times the cached attention step alone
    (:meth:`attnlab.KVCache.attend`, one token, B, H, D of the attention
    section), where the linear growth with context shows.
``generate``
    Wall time of ``generate(prompt, N)`` with and without the cache, the
    speed-up, and whether both produced the same tokens.

Method. Thread pools are set by :func:`thread_limits` (threadpoolctl for
NumPy's BLAS, ``torch.set_num_threads``; both restored afterwards) so every
contender gets the same cores. Each length runs the contenders interleaved,
in an order rotated every run, so drift in machine load hits them alike. A
call shorter than ``min_time`` is repeated until a sample lasts that long; the
sample is the mean per call. Results are the median of ``repeats`` samples,
with the spread (min and max).

Memory. NumPy: ``tracemalloc`` (NumPy reports its array buffers to it), the
peak during the call minus what was allocated before it; this counts the
output and every temporary. torch does not report to tracemalloc, so for
torch (and, as a cross-check, for NumPy too) the suite also measures the
process's resident-set high-water mark: Linux ``VmHWM`` reset through
``/proc/self/clear_refs`` just before the call, after ``malloc_trim`` has
returned freed heap pages, minus ``VmRSS`` before the call. It is page
granular, counts everything the process touched during the call (including
allocator slack) and is ``None`` where ``/proc`` is missing.

The library never prints: progress goes to an optional callback
``progress(done, total, label)``; ``attnlab bench`` draws it on stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import json
import math
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import AttnlabError, check_positive_int, missing_extra
from ..fast.kv_cache import KVCache
from ..nn.decoder import DecoderConfig, TinyDecoder

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "CONTENDERS",
    "SECTIONS",
    "SCHEMA",
    "BenchConfig",
    "BenchResult",
    "Timing",
    "attention_flops",
    "format_table",
    "peak_rss_bytes",
    "peak_traced_bytes",
    "run_benchmarks",
    "thread_limits",
    "write_report",
]

SCHEMA = "attnlab.studies.bench/1"
CONTENDERS = ("numpy_naive", "numpy_flash", "torch_naive", "torch_sdpa", "attnlab_torch")
SECTIONS = ("attention", "decode", "generate")
#: Contenders that hold (B, H, T, S) score matrices, skipped above ``max_memory``.
_NAIVE = {"numpy_naive", "torch_naive"}
_TORCH = {"torch_naive", "torch_sdpa", "attnlab_torch"}

Progress = Callable[[int, int, str], None]


# ----------------------------------------------------------------------------- config


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


# ----------------------------------------------------------------------------- measuring


@dataclass
class Timing:
    """Seconds per call, one sample per run; the median and spread of the samples."""

    samples: list[float]
    calls_per_sample: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max,
                "samples_s": list(self.samples), "calls_per_sample": self.calls_per_sample}


def attention_flops(B: int, H: int, T: int, S: int, D: int, causal: bool = False) -> int:
    """FLOPs of one attention forward: 4·B·H·T·S·D (Q Kᵀ and weights·V), half if causal.

    >>> attention_flops(1, 8, 4096, 4096, 64)
    34359738368
    """
    flops = 4 * B * H * T * S * D
    return flops // 2 if causal else flops


@contextlib.contextmanager
def thread_limits(threads: int, *, torch_too: bool = True) -> Iterator[None]:
    """Run NumPy's BLAS and (if ``torch_too`` and torch is installed) torch's intra-op
    pool with ``threads`` threads; both are restored on exit, also after an error."""
    threads = check_positive_int(threads, "threads")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise missing_extra("threadpoolctl", "bench", "attnlab bench") from None
    torch_module = _torch() if torch_too else None
    before = torch_module.get_num_threads() if torch_module is not None else None
    with threadpool_limits(limits=threads, user_api="blas"):
        if torch_module is not None:
            torch_module.set_num_threads(threads)
        try:
            yield
        finally:
            if torch_module is not None and before is not None:
                torch_module.set_num_threads(before)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _sample(fn: Callable[[], Any], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _calls_per_sample(fn: Callable[[], Any], min_time: float) -> int:
    """How many calls make a sample of at least ``min_time`` seconds (fn already warm)."""
    one = _sample(fn, 1)
    if one >= min_time or one <= 0:
        return 1
    return math.ceil(min(10_000.0, min_time / one))  # min_time / one may be inf


def peak_traced_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated during ``fn()`` as seen by tracemalloc (NumPy reports its
    buffers to it; torch does not), beyond what was allocated before the call."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        baseline = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1]
        del result
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - baseline)


def _proc_status(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field_name} not in /proc/self/status")


def _malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc), so that reusing them shows in the RSS."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


def peak_rss_bytes(fn: Callable[[], Any]) -> int | None:
    """Growth of the resident set during ``fn()``: VmHWM after minus VmRSS before.

    The high-water mark is reset first (``/proc/self/clear_refs`` = 5) after
    ``malloc_trim``. Page granular; counts everything the process touched.
    None where Linux's /proc interface is not available.
    """
    _malloc_trim()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        before = _proc_status("VmRSS")
    except OSError:
        return None
    result = fn()
    peak = _proc_status("VmHWM")
    del result
    return max(0, peak - before)


# ----------------------------------------------------------------------------- results


@dataclass
class AttentionRecord:
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


def environment(config: BenchConfig) -> dict[str, Any]:
    """Versions, CPU and thread settings the numbers were measured with."""
    from .. import __version__

    env: dict[str, Any] = {
        "attnlab": __version__, "python": platform.python_version(), "numpy": np.__version__,
        "platform": platform.platform(), "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "threads": config.threads,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    torch_module = _torch()
    env["torch"] = None if torch_module is None else torch_module.__version__
    try:
        from threadpoolctl import threadpool_info

        env["blas"] = [
            {k: info.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for info in threadpool_info() if info.get("user_api") == "blas"
        ]
    except ImportError:
        env["blas"] = None
    return env


# ----------------------------------------------------------------------------- attention


def _contender(
    name: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool
) -> Callable[[], Any] | str:
    """A no-argument callable running ``name`` on q, k, v, or why it cannot run."""
    if name == "numpy_naive":
        from ..attention import scaled_dot_product_attention

        return lambda: scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "numpy_flash":
        try:
            from ..fast.flash import flash_attention
        except ImportError as exc:
            return f"unavailable: attnlab.fast.flash ({exc})"
        return lambda: flash_attention(q, k, v, is_causal=causal)
    torch = _torch()
    if torch is None:
        return "unavailable: torch is not installed"
    import torch.nn.functional as F

    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))  # share memory with q, k, v
    T, S, D = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D)

    def run(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            with torch.inference_mode():
                return fn()
        return call

    if name == "torch_naive":
        causal_mask = torch.ones(T, S, dtype=torch.bool).tril(S - T) if causal else None

        def naive() -> Any:
            scores = (qt @ kt.transpose(-1, -2)) * scale  # (B, H, T, S)
            if causal_mask is not None:
                scores = scores.masked_fill(~causal_mask, float("-inf"))
            return torch.softmax(scores, dim=-1) @ vt  # (B, H, T, D)

        return run(naive)
    if name == "torch_sdpa":
        return run(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    try:
        import attnlab.torch as at
    except ImportError as exc:
        return f"unavailable: attnlab.torch ({exc})"
    return run(lambda: at.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))


def _as_numpy(out: Any) -> np.ndarray:
    return out.numpy() if hasattr(out, "numpy") else np.asarray(out)


def _run_attention(config: BenchConfig, tick: Callable[[str], None]) -> list[AttentionRecord]:
    records: list[AttentionRecord] = []
    rng = np.random.default_rng(config.seed)
    B, H, D = config.batch, config.heads, config.head_dim
    itemsize = np.dtype(config.dtype).itemsize
    for T in config.lengths:
        S = T
        shape = (B, H, T, D)
        q, k, v = (rng.standard_normal(shape).astype(config.dtype) for _ in range(3))
        flops = attention_flops(B, H, T, S, D, config.causal)
        by_name = {n: AttentionRecord(n, T, S, flops) for n in config.contenders}
        runnable: dict[str, Callable[[], Any]] = {}
        # Scores, scaled/masked scores and weights: about three (B, H, T, S) arrays at once.
        naive_bytes = 3 * B * H * T * S * itemsize
        reference: np.ndarray | None = None
        for name in config.contenders:
            if name in _NAIVE and naive_bytes > config.max_memory * 2**30:
                by_name[name].error = (f"skipped: needs ~{naive_bytes / 2**30:.1f} GiB for score "
                                       f"matrices, over max_memory = {config.max_memory:g} GiB")
                continue
            fn = _contender(name, q, k, v, config.causal)
            if isinstance(fn, str):
                by_name[name].error = fn
                continue
            try:
                out = _as_numpy(fn())  # warm-up, and the output checked below
            except (AttnlabError, MemoryError, RuntimeError) as exc:
                by_name[name].error = f"failed: {type(exc).__name__}: {exc}"
                continue
            if reference is None:
                reference = out.astype(np.float64)
            by_name[name].max_abs_diff = float(np.max(np.abs(out - reference))) if out.size else 0.0
            runnable[name] = fn
        tick(f"attention T={T}: warm-up")
        numbers = {name: _calls_per_sample(fn, config.min_time) for name, fn in runnable.items()}
        samples: dict[str, list[float]] = {name: [] for name in runnable}
        names = list(runnable)
        for run in range(config.repeats):
            shift = run % len(names) if names else 0
            for name in names[shift:] + names[:shift]:  # interleaved, order rotated each run
                samples[name].append(_sample(runnable[name], numbers[name]))
            tick(f"attention T={T}: run {run + 1}/{config.repeats}")
        for name in names:
            record = by_name[name]
            record.timing = Timing(samples[name], numbers[name])
            if config.measure_memory:
                record.rss_peak_bytes = peak_rss_bytes(runnable[name])
                if name in _TORCH:
                    record.peak_bytes, record.memory_method = record.rss_peak_bytes, "rss"
                else:
                    record.peak_bytes = peak_traced_bytes(runnable[name])
                    record.memory_method = "tracemalloc"
        tick(f"attention T={T}: memory")
        records.extend(by_name[n] for n in config.contenders)
    return records


# ----------------------------------------------------------------------------- decoding


def _run_decode(config: BenchConfig, tick: Callable[[str], None]) -> list[DecodeRecord]:
    model = TinyDecoder(config.model, seed=config.seed)
    rng = np.random.default_rng(config.seed + 1)
    longest = max(config.contexts) + config.repeats + 2
    ids = rng.integers(0, config.model.vocab_size, size=(1, longest))
    B, H, D = config.batch, config.heads, config.head_dim
    records = []
    for context in config.contexts:
        caches = model.new_caches(1)
        model.forward(ids[:, :context], caches)  # prefill, not timed
        model.forward(ids[:, context : context + 1], caches)  # warm-up step, not timed
        model.forward(ids[:, : context + 1])
        layer_cache = KVCache(B, H, D, capacity=context + config.repeats + 1, dtype=config.dtype)
        layer_cache.append(*(rng.standard_normal((B, H, context, D)) for _ in range(2)))
        one_token = [rng.standard_normal((B, H, 1, D)).astype(config.dtype) for _ in range(3)]
        cached: list[float] = []
        uncached: list[float] = []
        attend: list[float] = []
        diff = 0.0
        for run in range(config.repeats):
            end = context + 1 + run  # this step's new token sits at position `end`
            logits: dict[str, np.ndarray] = {}

            def step_cached(end: int = end, logits: dict[str, np.ndarray] = logits,
                            caches: list[Any] = caches) -> None:
                logits["cached"] = model.forward(ids[:, end : end + 1], caches)[:, -1]

            def step_full(end: int = end, logits: dict[str, np.ndarray] = logits) -> None:
                logits["uncached"] = model.forward(ids[:, : end + 1])[:, -1]

            def step_attend(cache: KVCache = layer_cache,
                            qkv: list[np.ndarray] = one_token) -> None:
                cache.attend(*qkv)

            order: list[tuple[Callable[[], Any], list[float]]] = [
                (step_cached, cached), (step_full, uncached), (step_attend, attend)]
            for fn, samples in order if run % 2 == 0 else order[::-1]:
                samples.append(_sample(fn, 1))
            diff = max(diff, float(np.max(np.abs(logits["cached"] - logits["uncached"]))))
            tick(f"decode S={context}: run {run + 1}/{config.repeats}")
        records.append(
            DecodeRecord(context, Timing(cached), Timing(uncached), Timing(attend), diff)
        )
    return records


def _run_generate(config: BenchConfig, tick: Callable[[str], None]) -> GenerateRecord:
    model = TinyDecoder(config.model, seed=config.seed)
    rng = np.random.default_rng(config.seed + 2)
    prompt = rng.integers(0, config.model.vocab_size, size=(1, config.prompt_len))
    N = config.new_tokens
    times: dict[bool, list[float]] = {True: [], False: []}
    outputs: dict[bool, Any] = {}
    for run in range(config.generate_repeats):
        for use_cache in ((True, False) if run % 2 == 0 else (False, True)):
            start = time.perf_counter()
            outputs[use_cache] = model.generate(prompt, N, use_cache=use_cache)
            times[use_cache].append(time.perf_counter() - start)
            tick(f"generate {'cached' if use_cache else 'uncached'}: "
                 f"run {run + 1}/{config.generate_repeats}")
    same = bool(np.array_equal(outputs[True].tokens, outputs[False].tokens))
    diff = float(np.max(np.abs(outputs[True].logits - outputs[False].logits))) if N else 0.0
    return GenerateRecord(config.prompt_len, N, Timing(times[True]), Timing(times[False]),
                          same, diff)


def run_benchmarks(config: BenchConfig | None = None, *, progress: Progress | None = None
                   ) -> BenchResult:
    """Run the sections of ``config`` (default: the full suite) and return the results.

    ``progress(done, total, label)`` is called after each unit of work.
    """
    config = BenchConfig() if config is None else config
    if not isinstance(config, BenchConfig):
        raise AttnlabError(f"config: expected a BenchConfig, got {type(config).__name__}")
    total = 0
    if "attention" in config.sections:
        total += len(config.lengths) * (config.repeats + 2)
    if "decode" in config.sections:
        total += len(config.contexts) * config.repeats
    if "generate" in config.sections:
        total += 2 * config.generate_repeats
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, label)

    uses_torch = "attention" in config.sections and bool(_TORCH & set(config.contenders))
    started = time.perf_counter()
    result = BenchResult(config, environment(config))
    with thread_limits(config.threads, torch_too=uses_torch):
        result.environment["blas_threads_in_use"] = _blas_threads()
        if "attention" in config.sections:
            result.attention = _run_attention(config, tick)
        if "decode" in config.sections:
            result.decode = _run_decode(config, tick)
        if "generate" in config.sections:
            result.generate = _run_generate(config, tick)
    result.seconds = time.perf_counter() - started
    return result


def _blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"]


# ----------------------------------------------------------------------------- reporting


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f}"


def _spread(value: float, low: float, high: float, digits: int) -> str:
    return f"{value:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def format_table(result: BenchResult) -> str:
    """The results as plain-text tables (what ``attnlab bench`` prints)."""
    cfg = result.config
    lines = [
        f"attnlab bench · {cfg.threads} thread{'s' if cfg.threads > 1 else ''} · "
        f"median of {cfg.repeats} runs [min–max] · {result.seconds:.1f} s",
    ]
    if result.attention:
        names = list(cfg.contenders)
        width = 22
        lines += [
            "",
            f"Attention forward, {cfg.dtype}, B={cfg.batch} H={cfg.heads} D={cfg.head_dim}, "
            f"T=S, {'causal' if cfg.causal else 'no mask'}: throughput (GFLOP/s, "
            f"4·B·H·T·S·D{' / 2' if cfg.causal else ''})",
            ("T=S".ljust(7) + "".join(n.ljust(width) for n in names)).rstrip(),
        ]
        mem_rows = []
        for T in cfg.lengths:
            rows = {r.contender: r for r in result.attention if r.T == T}
            cells, mem_cells = [], []
            for n in names:
                r = rows[n]
                if r.timing is None:
                    cells.append(("n/a" if r.error is None else r.error.split(":")[0]).ljust(width))
                    mem_cells.append("—".ljust(width))
                    continue
                t = r.timing
                cells.append(_spread(r.flops / t.median / 1e9, r.flops / t.max / 1e9,
                                     r.flops / t.min / 1e9, 1).ljust(width))
                mem = _mib(r.peak_bytes)
                if r.memory_method == "tracemalloc" and r.rss_peak_bytes is not None:
                    mem += f" (rss {_mib(r.rss_peak_bytes)})"
                mem_cells.append(mem.ljust(width))
            lines.append(str(T).ljust(7) + "".join(cells).rstrip())
            mem_rows.append(str(T).ljust(7) + "".join(mem_cells).rstrip())
        lines += ["", "Peak extra memory (MiB; NumPy: tracemalloc, with the RSS growth in "
                  "brackets; torch: RSS growth)",
                  ("T=S".ljust(7) + "".join(n.ljust(width) for n in names)).rstrip()]
        lines += mem_rows
        notes = sorted({f"{r.contender}: {r.error}" for r in result.attention if r.error})
        lines += [f"  note: {n}" for n in notes]
    if result.decode:
        m = cfg.model
        lines += [
            "",
            f"Decode latency per token (ms), TinyDecoder E={m.d_model} H={m.num_heads} "
            f"L={m.num_layers} V={m.vocab_size} {m.dtype}",
            "context".ljust(9) + "cached".ljust(24) + "uncached".ljust(26) + "speed-up".ljust(10)
            + f"KVCache.attend alone (H={cfg.heads} D={cfg.head_dim})",
        ]
        for d in result.decode:
            c, u, a = d.cached, d.uncached, d.attend
            lines.append(
                str(d.context).ljust(9)
                + _spread(c.median * 1e3, c.min * 1e3, c.max * 1e3, 2).ljust(24)
                + _spread(u.median * 1e3, u.min * 1e3, u.max * 1e3, 1).ljust(26)
                + f"{u.median / c.median:.1f}×".ljust(10)
                + _spread(a.median * 1e3, a.min * 1e3, a.max * 1e3, 3)
            )
        fit = result.decode_fit()
        if fit is not None:
            for name in ("cached", "uncached", "attend"):
                f = fit[name]
                lines.append(
                    f"  {name}: {f['intercept_s'] * 1e3:.3f} ms + "
                    f"{f['seconds_per_context_token'] * 1e6:.3f} µs × context "
                    f"(R² {f['r2_linear']:.3f}); log-log slope {f['loglog_exponent']:.2f}"
                )
    g = result.generate
    if g is not None:
        lines += [
            "",
            f"Generate {g.new_tokens} tokens after a {g.prompt_len}-token prompt "
            f"(median of {cfg.generate_repeats} runs [min–max])",
            f"  cached   {_spread(g.cached.median, g.cached.min, g.cached.max, 2)} s",
            f"  uncached {_spread(g.uncached.median, g.uncached.min, g.uncached.max, 2)} s",
            f"  speed-up {g.speedup:.1f}×; same tokens: {'yes' if g.same_tokens else 'NO'} "
            f"(max |Δlogit| {g.max_abs_logit_diff:.1e})",
        ]
    return "\n".join(lines)


def _figure(figsize: tuple[float, float] = (6.4, 4.2)) -> Figure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise missing_extra("matplotlib", "viz", "attnlab bench plots") from None
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _attention_plot(result: BenchResult, what: str) -> Figure:
    cfg = result.config
    fig = _figure()
    ax = fig.add_subplot()
    for name in cfg.contenders:
        rows = [r for r in result.attention if r.contender == name and r.timing is not None]
        if what == "memory":
            rows = [r for r in rows if r.peak_bytes is not None]
        if not rows:
            continue
        xs = [r.T for r in rows]
        if what == "throughput":
            timings = [r.timing for r in rows if r.timing is not None]
            ys = [r.flops / t.median / 1e9 for r, t in zip(rows, timings, strict=True)]
            low = [y - r.flops / t.max / 1e9 for y, r, t in zip(ys, rows, timings, strict=True)]
            high = [r.flops / t.min / 1e9 - y for y, r, t in zip(ys, rows, timings, strict=True)]
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=name)
        else:
            ax.plot(xs, [max(r.peak_bytes or 0, 1) / 2**20 for r in rows], marker="o",
                    label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length T = S")
    if what == "throughput":
        ax.set_ylabel("GFLOP/s (median, min–max)")
        ax.set_title(f"Attention forward throughput, {cfg.dtype}, H={cfg.heads} D={cfg.head_dim}, "
                     f"{cfg.threads} thread(s)")
    else:
        ax.set_yscale("log")
        ax.set_ylabel("peak extra memory (MiB)")
        ax.set_title("Peak memory (NumPy: tracemalloc; torch: RSS growth)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def _decode_plot(result: BenchResult) -> Figure:
    fig = _figure()
    ax = fig.add_subplot()
    xs = [r.context for r in result.decode]
    labels = {"cached": "model step, KV cache", "uncached": "model step, recompute all",
              "attend": f"KVCache.attend alone (H={result.config.heads} "
                        f"D={result.config.head_dim})"}
    for name, label in labels.items():
        ys = [getattr(r, name).median * 1e3 for r in result.decode]
        low = [y - getattr(r, name).min * 1e3 for y, r in zip(ys, result.decode, strict=True)]
        high = [getattr(r, name).max * 1e3 - y for y, r in zip(ys, result.decode, strict=True)]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("latency per token (ms)")
    ax.set_title("TinyDecoder: one decoding step vs context")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def _generate_plot(g: GenerateRecord) -> Figure:
    fig = _figure((5.0, 3.6))
    ax = fig.add_subplot()
    labels = ["KV cache", "recompute all"]
    medians = [g.cached.median, g.uncached.median]
    errors = [[g.cached.median - g.cached.min, g.uncached.median - g.uncached.min],
              [g.cached.max - g.cached.median, g.uncached.max - g.uncached.median]]
    ax.bar(labels, medians, yerr=errors, capsize=4, color=["tab:green", "tab:red"])
    ax.set_ylabel("seconds")
    ax.set_title(f"{g.new_tokens} tokens after a {g.prompt_len}-token prompt: "
                 f"{g.speedup:.1f}× faster")
    return fig


def write_report(result: BenchResult, out_dir: str | os.PathLike[str], *, plots: bool = True
                 ) -> list[Path]:
    """Write results.json, table.txt and (with ``plots``) the PNG figures into ``out_dir``.

    Returns the paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    json_path = out / "results.json"
    json_path.write_text(result.to_json() + "\n", encoding="utf-8")
    table_path = out / "table.txt"
    table_path.write_text(format_table(result) + "\n", encoding="utf-8")
    written += [json_path, table_path]
    if plots:
        from ..report.heatmaps import save_figure

        figures: list[tuple[str, Figure]] = []
        if any(r.timing is not None for r in result.attention):
            figures.append(("throughput.png", _attention_plot(result, "throughput")))
            if any(r.peak_bytes is not None for r in result.attention):
                figures.append(("memory.png", _attention_plot(result, "memory")))
        if result.decode:
            figures.append(("decode_latency.png", _decode_plot(result)))
        if result.generate is not None:
            figures.append(("generate.png", _generate_plot(result.generate)))
        for name, fig in figures:
            written.append(save_figure(fig, out / name))
    return written
