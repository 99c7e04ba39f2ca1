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

Method (:mod:`attnlab.studies.measure`, shared by every study). Thread pools are
set by :func:`~attnlab.studies.measure.limit_threads` (NumPy's BLAS and OpenMP
through threadpoolctl, and torch's pool; restored afterwards) so every contender
gets the same cores. Each length runs the contenders interleaved, in an order
rotated every round, so drift in machine load hits them alike. A call shorter than
``min_time`` is repeated until a sample lasts that long; the sample is the mean per
call. Results are the median of ``repeats`` samples, with the spread (min and max).

Memory. NumPy: ``tracemalloc`` (NumPy reports its array buffers to it), the peak
during the call minus what was allocated before it; this counts the output and
every temporary. torch does not report to tracemalloc, so for torch (and, as a
cross-check, for NumPy too) the suite also measures the growth of the process's
resident set (:func:`~attnlab.studies.measure.peak_rss_bytes`: page granular,
None where ``/proc`` is missing).

What to run is a :class:`~attnlab.studies.bench_config.BenchConfig`; the results are
data (:mod:`attnlab.studies.bench_results`); the tables and plots are made by
:mod:`attnlab.studies.bench_report`. The library never prints: progress
goes to an optional callback ``progress(done, total, label)``; ``attnlab bench``
draws it on stderr.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..fast.kv_cache import KVCache
from ..messages import Message, msg
from ..nn.decoder import TinyDecoder
from .bench_config import BenchConfig
from .bench_results import AttentionRecord, BenchResult, DecodeRecord, GenerateRecord
from .measure import (
    blas_threads,
    environment,
    interleaved,
    limit_threads,
    peak_rss_bytes,
    peak_traced_bytes,
)

__all__ = ["attention_flops", "run_benchmarks"]

#: Contenders that hold (B, H, T, S) score matrices, skipped above ``max_memory``.
_NAIVE = {"numpy_naive", "torch_naive"}
_TORCH = {"torch_naive", "torch_sdpa", "attnlab_torch"}

Progress = Callable[[int, int, Message], None]


def attention_flops(B: int, H: int, T: int, S: int, D: int, causal: bool = False) -> int:
    """FLOPs of one attention forward: 4·B·H·T·S·D (Q Kᵀ and weights·V), half if causal.

    >>> attention_flops(1, 8, 4096, 4096, 64)
    34359738368
    """
    flops = 4 * B * H * T * S * D
    return flops // 2 if causal else flops



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
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return "unavailable: torch is not installed"

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


def _run_attention(config: BenchConfig, tick: Callable[[Message], None]) -> list[AttentionRecord]:
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
        tick(msg("bench.progress.warm_up", T=T))

        def after_round(run: int, T: int = T) -> None:
            tick(msg("bench.progress.attention_run", T=T, run=run + 1, runs=config.repeats))

        timings = interleaved(runnable, config.repeats, min_time=config.min_time,
                              after_round=after_round)
        for name, timing in timings.items():
            record = by_name[name]
            record.timing = timing
            if config.measure_memory:
                record.rss_peak_bytes = peak_rss_bytes(runnable[name])
                if name in _TORCH:
                    record.peak_bytes, record.memory_method = record.rss_peak_bytes, "rss"
                else:
                    record.peak_bytes = peak_traced_bytes(runnable[name])
                    record.memory_method = "tracemalloc"
        tick(msg("bench.progress.memory", T=T))
        records.extend(by_name[n] for n in config.contenders)
    return records


# ----------------------------------------------------------------------------- decoding


def _run_decode(config: BenchConfig, tick: Callable[[Message], None]) -> list[DecodeRecord]:
    model = TinyDecoder(config.model, seed=config.seed)
    rng = np.random.default_rng(config.seed + 1)
    longest = max(config.contexts) + config.repeats + 2
    ids = rng.integers(0, config.model.vocab_size, size=(1, longest))
    return [_decode_at(context, model, ids, rng, config, tick) for context in config.contexts]


def _decode_at(context: int, model: TinyDecoder, ids: np.ndarray, rng: np.random.Generator,
               config: BenchConfig, tick: Callable[[Message], None]) -> DecodeRecord:
    """One context length: a cached step, a recomputed step, KVCache.attend alone."""
    B, H, D = config.batch, config.heads, config.head_dim
    caches = model.new_caches(1)
    model.forward(ids[:, :context], caches)  # prefill, not timed
    model.forward(ids[:, context : context + 1], caches)  # warm-up step, not timed
    model.forward(ids[:, : context + 1])
    layer_cache = KVCache(B, H, D, capacity=context + config.repeats + 1, dtype=config.dtype)
    layer_cache.append(*(rng.standard_normal((B, H, context, D)) for _ in range(2)))
    one_token = [rng.standard_normal((B, H, 1, D)).astype(config.dtype) for _ in range(3)]
    # Round r decodes the token at position context + 1 + r, cached and recomputed.
    end, worst = context + 1, 0.0
    logits: dict[str, np.ndarray] = {}

    def step_cached() -> None:
        logits["cached"] = model.forward(ids[:, end : end + 1], caches)[:, -1]

    def step_full() -> None:
        logits["uncached"] = model.forward(ids[:, : end + 1])[:, -1]

    def step_attend() -> None:
        layer_cache.attend(*one_token)

    def next_token(run: int) -> None:
        nonlocal end, worst
        worst = max(worst, float(np.max(np.abs(logits["cached"] - logits["uncached"]))))
        end += 1
        tick(msg("bench.progress.decode_run", S=context, run=run + 1, runs=config.repeats))

    # min_time 0: a cached step appends one token, so it runs exactly once per sample.
    timings = interleaved({"cached": step_cached, "uncached": step_full, "attend": step_attend},
                          config.repeats, after_round=next_token)
    return DecodeRecord(context, timings["cached"], timings["uncached"], timings["attend"], worst)


def _run_generate(config: BenchConfig, tick: Callable[[Message], None]) -> GenerateRecord:
    model = TinyDecoder(config.model, seed=config.seed)
    rng = np.random.default_rng(config.seed + 2)
    prompt = rng.integers(0, config.model.vocab_size, size=(1, config.prompt_len))
    N = config.new_tokens
    outputs: dict[bool, Any] = {}

    def generate(use_cache: bool) -> Callable[[], None]:
        def call() -> None:
            outputs[use_cache] = model.generate(prompt, N, use_cache=use_cache)
            tick(msg("bench.progress.generate",
                     how=msg("bench.col.cached" if use_cache else "bench.col.uncached")))
        return call

    timings = interleaved({"cached": generate(True), "uncached": generate(False)},
                          config.generate_repeats)
    same = bool(np.array_equal(outputs[True].tokens, outputs[False].tokens))
    diff = float(np.max(np.abs(outputs[True].logits - outputs[False].logits))) if N else 0.0
    return GenerateRecord(config.prompt_len, N, timings["cached"], timings["uncached"],
                          same, diff)


def run_benchmarks(config: BenchConfig | None = None, *, progress: Progress | None = None
                   ) -> BenchResult:
    """Run the sections of ``config`` (default: the full suite) and return the results.

    ``progress(done, total, label)`` is called after each unit of work; ``label`` is a
    keyed :class:`~attnlab.messages.Message` (``str()`` is the English,
    ``.render("zh")`` the Chinese).
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

    def tick(label: Message) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(min(done, total), total, label)

    uses_torch = "attention" in config.sections and bool(_TORCH & set(config.contenders))
    started = time.perf_counter()
    result = BenchResult(config, environment(config.threads))
    with limit_threads(config.threads, torch=uses_torch, feature="attnlab bench"):
        result.environment["blas_threads_in_use"] = blas_threads()
        if "attention" in config.sections:
            result.attention = _run_attention(config, tick)
        if "decode" in config.sections:
            result.decode = _run_decode(config, tick)
        if "generate" in config.sections:
            result.generate = _run_generate(config, tick)
    result.seconds = time.perf_counter() - started
    return result
