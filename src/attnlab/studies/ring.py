"""Measuring ring attention on local gloo processes, and the NumPy simulation, for ``attnlab ring``.

:func:`measure_ring` spawns W processes; each builds the same random inputs from
the seed, keeps its shard (the full tensors are freed before measuring), runs
:func:`attnlab.distributed.ring_attention` once to warm up and once measured, and
reports its peak memory (growth of the resident set during the measured call),
the seconds each ring step spent computing and waiting, and the bytes it sent.
The outputs are unsharded and compared with single-process
:func:`attnlab.torch.scaled_dot_product_attention` over the full sequence.

:func:`simulate_ring` runs :func:`attnlab.distributed.simulate` on the same kind
of inputs and compares it with single-process flash attention.

Dimension legend: B batch, H heads, Hkv key/value heads, T sequence length,
D head dim, W world size.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["RingSettings", "measure_ring", "rank_run", "simulate_ring"]


@dataclass(frozen=True)
class RingSettings:
    world_size: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    batch: int = 1
    layout: str = "zigzag"
    is_causal: bool = False
    dtype: str = "float32"
    seed: int = 0
    threads: int = 1
    backward: bool = False
    check: bool = True
    repeats: int = 3


def _full_inputs(s: RingSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (B, H, T, D), k, v (B, Hkv, T, D) with O(1) scores, in the settings' dtype."""
    rng = np.random.default_rng(s.seed)
    dtype = np.float64 if s.dtype == "float64" else np.float32
    q = rng.standard_normal((s.batch, s.heads, s.seq, s.head_dim), dtype=dtype)
    k = rng.standard_normal((s.batch, s.kv_heads, s.seq, s.head_dim), dtype=dtype)
    v = rng.standard_normal((s.batch, s.kv_heads, s.seq, s.head_dim), dtype=dtype)
    return q, k, v


def rank_run(rank: int, world_size: int, s: RingSettings) -> dict[str, Any]:
    """One rank's measured ring call (run inside :func:`attnlab.distributed.spawn`)."""
    import torch

    from ..distributed import ring_attention, shard
    from ..distributed.comm import CommStats
    from .measure import peak_rss_bytes

    full = _full_inputs(s)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(
        shard(x, rank=rank, world_size=world_size, layout=s.layout))) for x in full)  # type: ignore[arg-type]
    del full
    if s.backward:
        q, k, v = (t.requires_grad_() for t in (q, k, v))

    def call(stats: CommStats | None) -> torch.Tensor:
        out = ring_attention(q, k, v, is_causal=s.is_causal, layout=s.layout, stats=stats)
        assert isinstance(out, torch.Tensor)
        if s.backward:
            out.sum().backward()
        return out.detach()

    with torch.no_grad() if not s.backward else torch.enable_grad():
        call(None)  # warm-up: first-call costs (allocator, gloo buffers) stay out of the numbers
        runs = []
        for _ in range(s.repeats):
            stats = CommStats()
            outputs: list[torch.Tensor] = []
            started = time.perf_counter()
            peak = peak_rss_bytes(lambda: outputs.append(call(stats)))  # noqa: B023
            runs.append((time.perf_counter() - started, peak, stats))
    # The median call by time; every call's peak memory is the same computation's.
    seconds, _, stats = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    peaks = [p for _, p, _ in runs if p is not None]
    return {
        "rank": rank, "peak_bytes": max(peaks) if peaks else None, "seconds": seconds,
        "step_compute_s": [statistics.median(r[2].step_compute_s[i] for r in runs)
                           for i in range(world_size)],
        "step_wait_s": [statistics.median(r[2].step_wait_s[i] for r in runs)
                        for i in range(world_size)],
        "bytes_sent": stats.bytes_sent, "forward_kv": stats.forward_kv,
        "out": outputs[0].numpy() if s.check else None,
    }


def measure_ring(s: RingSettings, *, timeout: float = 600.0) -> dict[str, Any]:
    """Spawn ``s.world_size`` gloo processes, measure one ring call each, check the result.

    Returns settings, per-rank results (peak bytes, seconds, per-step compute and
    wait seconds, bytes sent), the imbalance (max / min of the ranks' compute
    seconds) and, if ``s.check``, the max abs error against single-process attention.
    """
    from ..distributed import spawn, unshard

    ranks = spawn(rank_run, s.world_size, (s,), timeout=timeout, threads=s.threads)
    compute = [sum(r["step_compute_s"]) for r in ranks]
    result: dict[str, Any] = {
        "settings": asdict(s),
        "ranks": [{key: value for key, value in r.items() if key != "out"} for r in ranks],
        "imbalance": max(compute) / min(compute) if min(compute) > 0 else float("inf"),
        "error": None,
    }
    if s.check:
        import torch

        from ..torch import scaled_dot_product_attention
        from ..torch.gqa import repeat_kv

        out = unshard([r["out"] for r in ranks], layout=s.layout)  # type: ignore[arg-type]
        q, k, v = (torch.from_numpy(x) for x in _full_inputs(s))
        group = s.heads // s.kv_heads
        with torch.no_grad():
            expected = scaled_dot_product_attention(
                q, repeat_kv(k, group), repeat_kv(v, group),
                is_causal=s.is_causal).numpy()
        result["error"] = float(np.abs(out - expected).max())
    return result


def simulate_ring(s: RingSettings) -> tuple[Any, float]:
    """The NumPy virtual ring on the settings' inputs, and its max abs error against
    single-process flash attention."""
    from ..distributed import simulate
    from ..fast.flash import flash_attention
    from ..gqa import repeat_kv

    q, k, v = _full_inputs(s)
    sim = simulate(q, k, v, world_size=s.world_size, layout=s.layout,  # type: ignore[arg-type]
                   is_causal=s.is_causal)
    group = s.heads // s.kv_heads
    expected = flash_attention(q, repeat_kv(k, group), repeat_kv(v, group),
                               is_causal=s.is_causal)
    return sim, float(np.abs(sim.out - expected).max())
