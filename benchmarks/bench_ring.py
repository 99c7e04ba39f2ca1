"""Ring attention on local gloo processes: per-rank peak memory vs W, causal balance per layout.

``--memory`` (default): T = 32,768, B 1, H 2, D 64, float32, causal, zigzag; for
W = 1, 2, 4 gloo processes (one torch thread each), each rank's peak memory during
one forward ring call after a warm-up call: the growth of its resident set
(VmHWM, the inputs already in place). Targets: ≤ 0.6× of W = 1 at W = 2,
≤ 0.35× at W = 4. glibc raises its mmap threshold after freeing a large block, so
the smaller score chunks of short shards may stay resident on the heap; run with
``MALLOC_MMAP_THRESHOLD_=1048576`` to measure what the ring itself holds.

``--balance``: causal work per rank at W = 4 for each layout (T = 8,192, H 2, D 64):
- counted: the score pairs each rank computes (``ring_blocks``), max / min;
- timed in one process: each rank's blocks run rank after rank on the local kernel
  (no communication, no contention for the 2 cores), median of ``--repeats``;
- timed on 4 gloo processes: max / min of the ranks' compute seconds (with 4
  processes on a machine of fewer cores, the ranks also share the cores).
Target: zigzag ≤ 1.2.

    .venv/bin/python benchmarks/bench_ring.py --memory
    MALLOC_MMAP_THRESHOLD_=1048576 .venv/bin/python benchmarks/bench_ring.py --memory
    .venv/bin/python benchmarks/bench_ring.py --balance
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from attnlab.distributed import LAYOUTS, ring_blocks, shard
from attnlab.distributed.local import TorchLocalKernel, merge_partial
from attnlab.studies.ring import RingSettings, measure_ring


def memory(args: argparse.Namespace) -> None:
    print(f"per-rank peak memory of one forward · T = {args.seq} B=1 H={args.heads} D=64 · "
          f"float32 · causal · zigzag · gloo, 1 thread per rank")
    base = None
    for W in (1, 2, 4):
        s = RingSettings(world_size=W, seq=args.seq, heads=args.heads, kv_heads=args.heads,
                         head_dim=64, layout="zigzag", is_causal=True, check=False, repeats=1)
        result = measure_ring(s, timeout=1800)
        peaks = [r["peak_bytes"] for r in result["ranks"]]
        top = max(peaks)
        base = base or top
        print(f"  W = {W}: max over ranks {top / 2**20:8.1f} MiB  ({top / base:.2f}× W = 1)  "
              f"ranks: {', '.join(f'{p / 2**20:.1f}' for p in peaks)} MiB · "
              f"call {max(r['seconds'] for r in result['ranks']):.1f} s")


def _rank_seconds(layout: str, W: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  repeats: int) -> list[float]:
    """Each rank's causal ring work, timed in this process, rank after rank."""
    kernel, scale, n = TorchLocalKernel(), q.shape[-1] ** -0.5, q.shape[-2] // W
    seconds = []
    for r in range(W):
        q_r = shard(q, rank=r, world_size=W, layout=layout).unsqueeze(2)  # (B, H, 1, n, D)
        shards = [(shard(k, rank=s, world_size=W, layout=layout).unsqueeze(2),
                   shard(v, rank=s, world_size=W, layout=layout).unsqueeze(2))
                  for s in range(W)]
        times = []
        for _ in range(repeats):
            out = torch.zeros((*q_r.shape[:-1], v.shape[-1]))
            lse = torch.full(q_r.shape[:-1], float("-inf"))
            started = time.perf_counter()
            for step in range(W):
                src = (r - step) % W
                k_s, v_s = shards[src]
                for blk in ring_blocks(r, src, n, world_size=W, layout=layout, is_causal=True):
                    part_out, part_lse = kernel.forward(
                        q_r[..., blk.rows, :], k_s[..., blk.cols, :], v_s[..., blk.cols, :],
                        None, blk.diagonal, scale)
                    out[..., blk.rows, :], lse[..., blk.rows] = merge_partial(
                        out[..., blk.rows, :], lse[..., blk.rows], part_out, part_lse)
            times.append(time.perf_counter() - started)
        seconds.append(statistics.median(times))
    return seconds


def balance(args: argparse.Namespace) -> None:
    W, T = 4, args.balance_seq
    print(f"causal work per rank · W = {W} · T = {T} B=1 H={args.heads} D=64 · float32")
    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.standard_normal((1, args.heads, T, 64), dtype=np.float32))
               for _ in range(3))
    for layout in LAYOUTS:
        pairs = [sum(b.pairs() for s in range(W) for b in ring_blocks(
            r, (r - s) % W, T // W, world_size=W, layout=layout, is_causal=True))
            for r in range(W)]
        local = _rank_seconds(layout, W, q, k, v, args.repeats)
        s = RingSettings(world_size=W, seq=T, heads=args.heads, kv_heads=args.heads,
                         head_dim=64, layout=layout, is_causal=True, check=False,
                         repeats=args.repeats)
        spawned = measure_ring(s, timeout=1800)
        print(f"  {layout:<10} counted {max(pairs) / min(pairs):5.2f} · one process "
              f"{max(local) / min(local):5.2f} ({', '.join(f'{1e3 * t:.0f}' for t in local)} ms)"
              f" · gloo processes {spawned['imbalance']:5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--balance", action="store_true")
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--balance-seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.balance:
        balance(args)
    if args.memory or not args.balance:
        memory(args)


if __name__ == "__main__":
    main()
