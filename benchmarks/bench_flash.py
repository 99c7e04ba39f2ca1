"""NumPy flash attention against torch's fused CPU kernel, and at 65,536 tokens.

Default: ``attnlab.flash_attention`` vs ``torch.nn.functional.scaled_dot_product_attention``
on CPU, float32, B = 1, H = 8, T = S = 4096, D = 64, forward only, the same
number of threads for both: flash gets ``num_threads=--threads`` (its parts
run on that many threads, BLAS held to one thread each), and around both
threadpoolctl limits NumPy's BLAS to ``--threads``; ``torch.set_num_threads``
limits torch. torch gets 4-D (B, H, T, D) inputs, which is what selects its
fused flash kernel on CPU (3-D inputs fall back to the plain "math" path).
Throughput in GFLOP/s with forward FLOPs = 4·B·H·T·S·D (half with
``--causal``). The two run interleaved (A B, then B A, ...) so that drift in
machine load hits both; the script prints the median of ``--repeats`` runs,
the spread (min .. max) and the ratio of medians. Outputs are checked to agree
before anything is timed. Target: flash >= 1.0x torch, causal too.

Each call's CPU time (the process's, all threads) is printed too. On a machine
shared with other work, wall time measures the share of the cores each side
happened to get; at one thread the ratio of CPU times is the steadier figure of
the work each side does (at more threads it also counts threads that spin while
waiting, so only wall time is throughput there).

``--long``: flash alone at T = S = 65,536, one head, D = 64 (the plain path
would need a 16 GiB score matrix), reporting time and peak extra memory, both
as traced by tracemalloc (NumPy's allocations, inputs excluded) and as the
growth of the process's peak RSS. torch is not imported in this mode, so the
RSS figure is the flash call's own. Target: < 1 GiB extra.

``--blocks``: flash alone at several (block_q, block_k) tiles, interleaved, to
choose the defaults.

    .venv/bin/python benchmarks/bench_flash.py                  # vs torch, 1 thread
    .venv/bin/python benchmarks/bench_flash.py --threads 2 --causal
    .venv/bin/python benchmarks/bench_flash.py --long
    .venv/bin/python benchmarks/bench_flash.py --blocks 128x256 256x512 512x512
    .venv/bin/python benchmarks/bench_flash.py --options --seq 2048

``--backward``: ``attnlab.flash_attention_backward`` against torch's flash
backward (``torch.autograd.grad`` through the same 4-D SDPA call, its graph
kept), both given the forward's results, at B = 1, H = 8, T = S = ``--seq``
(2048 unless set), D = 64; FLOPs counted as FlashAttention's benchmarks count
them, backward = 2.5 × forward. Gradients are checked to agree first.
Target: >= 0.9x torch.

    .venv/bin/python benchmarks/bench_flash.py --backward --threads 2 --causal

``--options``: causal flash alone against causal flash with a soft cap, ALiBi
slopes, top-left alignment and a window of 512 keys (whose skipped tiles make
it faster), interleaved; the time of each as a multiple of causal's.
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from attnlab.fast.flash import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    flash_attention,
    flash_attention_backward,
)


def forward_flops(B: int, H: int, T: int, S: int, D: int, causal: bool) -> float:
    flops = 4.0 * B * H * T * S * D
    return flops / 2 if causal else flops


def interleaved(
    contenders: dict[str, Callable[[], object]], repeats: int
) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds per call of each contender, run in alternating order after one
    warm-up each."""
    for fn in contenders.values():
        fn()
    names = list(contenders)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else names[::-1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            contenders[name]()
            times[name].append((time.perf_counter() - start, time.process_time() - start_cpu))
    return times


def report(times: dict[str, list[tuple[float, float]]], flops: float) -> None:
    for name, runs in times.items():
        wall = [w for w, _ in runs]
        med = statistics.median(wall)
        cpu = statistics.median(c for _, c in runs)
        print(f"  {name:34s} median {med * 1e3:8.1f} ms  {flops / med / 1e9:6.1f} GFLOP/s  "
              f"(spread {flops / max(wall) / 1e9:.1f} .. {flops / min(wall) / 1e9:.1f})  "
              f"cpu {cpu * 1e3:8.1f} ms")


def versus_torch(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    B, H, T, D = 1, args.heads, args.seq, args.dim
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, T, D), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))  # (B, H, T, D): selects flash on CPU
    torch.set_num_threads(args.threads)
    backend = SDPBackend(torch._fused_sdp_choice(tq, tk, tv, is_causal=args.causal))

    def run_flash() -> np.ndarray:
        return flash_attention(q, k, v, is_causal=args.causal, num_threads=args.threads)

    def run_torch() -> torch.Tensor:
        with torch.inference_mode():
            return F.scaled_dot_product_attention(tq, tk, tv, is_causal=args.causal)

    with threadpool_limits(limits=args.threads, user_api="blas"):
        gap = float(np.abs(run_flash() - run_torch().numpy()).max())
        if gap > 1e-4:
            sys.exit(f"outputs disagree: max |flash - torch| = {gap:.2e}")
        times = interleaved({"attnlab flash_attention (NumPy)": run_flash,
                             f"torch SDPA ({backend.name})": run_torch}, args.repeats)

    flops = forward_flops(B, H, T, T, D, args.causal)
    print(f"forward, float32, B={B} H={H} T=S={T} D={D}{' causal' if args.causal else ''}, "
          f"{args.threads} thread(s), {args.repeats} interleaved runs, "
          f"tiles {DEFAULT_BLOCK_Q}x{DEFAULT_BLOCK_K}, max |diff| {gap:.1e}")
    print(f"  numpy {np.__version__}, torch {torch.__version__}, {platform.processor() or 'cpu'}")
    report(times, flops)
    wall, cpu = ([statistics.median(run[i] for run in runs) for runs in times.values()]
                 for i in (0, 1))
    print(f"throughput ratio flash / torch SDPA = {wall[1] / wall[0]:.2f}x (target >= 1.0x); "
          f"by CPU time {cpu[1] / cpu[0]:.2f}x")


def versus_torch_backward(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    B, H, T, D = 1, args.heads, args.seq, args.dim
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, H, T, D), dtype=np.float32) for _ in range(4))
    torch.set_num_threads(args.threads)
    tq, tk, tv = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    tout = F.scaled_dot_product_attention(tq, tk, tv, is_causal=args.causal)  # (B, H, T, D)
    tdout = torch.from_numpy(dout)
    backend = tout.grad_fn.name() if tout.grad_fn is not None else "?"

    with threadpool_limits(limits=args.threads, user_api="blas"):
        out, lse = flash_attention(q, k, v, is_causal=args.causal, return_lse=True,
                                   num_threads=args.threads)

        def run_flash() -> tuple[np.ndarray, ...]:
            return flash_attention_backward(q, k, v, out, lse, dout, is_causal=args.causal,
                                            num_threads=args.threads)

        def run_torch() -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(tout, (tq, tk, tv), tdout, retain_graph=True)

        gap = max(float(np.abs(mine - theirs.numpy()).max())
                  for mine, theirs in zip(run_flash(), run_torch(), strict=True))
        if gap > 1e-4:
            sys.exit(f"gradients disagree: max |flash - torch| = {gap:.2e}")
        times = interleaved({"attnlab flash_attention_backward": run_flash,
                             f"torch SDPA backward ({backend})": run_torch}, args.repeats)

    flops = 2.5 * forward_flops(B, H, T, T, D, args.causal)
    print(f"backward, float32, B={B} H={H} T=S={T} D={D}{' causal' if args.causal else ''}, "
          f"{args.threads} thread(s), {args.repeats} interleaved runs, "
          f"tiles {DEFAULT_BLOCK_Q}x{DEFAULT_BLOCK_K}, max |diff| of dq, dk, dv {gap:.1e}")
    print(f"  numpy {np.__version__}, torch {torch.__version__}, {platform.processor() or 'cpu'}")
    report(times, flops)
    wall, cpu = ([statistics.median(run[i] for run in runs) for runs in times.values()]
                 for i in (0, 1))
    best = [min(w for w, _ in runs) for runs in times.values()]
    print(f"throughput ratio flash / torch backward = {wall[1] / wall[0]:.2f}x (target >= 0.9x); "
          f"by CPU time {cpu[1] / cpu[0]:.2f}x; fastest runs {best[1] / best[0]:.2f}x")


def long_sequence(args: argparse.Namespace) -> None:
    T = S = args.long_seq
    D = args.dim
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, n, D), dtype=np.float32) for n in (T, S, S))
    inputs = q.nbytes + k.nbytes + v.nbytes
    with threadpool_limits(limits=args.threads, user_api="blas"):
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        tracemalloc.start()
        start = time.perf_counter()
        out = flash_attention(q, k, v, is_causal=args.causal, num_threads=args.threads)
        elapsed = time.perf_counter() - start
        traced_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    flops = forward_flops(1, 1, T, S, D, args.causal)
    gib = 2.0**30
    print(f"flash_attention forward, float32, one head, T=S={T:,} D={D}"
          f"{' causal' if args.causal else ''}, {args.threads} thread(s), "
          f"tiles {DEFAULT_BLOCK_Q}x{DEFAULT_BLOCK_K}")
    print(f"  time {elapsed:.1f} s ({flops / elapsed / 1e9:.1f} GFLOP/s)")
    print(f"  inputs q, k, v: {inputs / 2**20:.0f} MiB; output {out.nbytes / 2**20:.0f} MiB; "
          f"the plain path's score matrix alone would be {T * S * 4 / gib:.0f} GiB")
    print(f"  peak extra memory (tracemalloc, output included): {traced_peak / 2**20:.1f} MiB")
    print(f"  peak RSS growth during the call: {(rss_after - rss_before) / 2**20:.1f} MiB "
          f"(peak RSS {rss_after / 2**20:.0f} MiB)")
    met = max(traced_peak, rss_after - rss_before) < gib
    print(f"  target < 1 GiB extra: {'met' if met else 'NOT met'}")


def block_sweep(args: argparse.Namespace) -> None:
    B, H, T, D = 1, args.heads, args.seq, args.dim
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, T, D), dtype=np.float32) for _ in range(3))
    tiles = [tuple(int(n) for n in spec.split("x")) for spec in args.blocks]
    contenders = {
        f"tiles {bq}x{bk}": (lambda bq=bq, bk=bk: flash_attention(
            q, k, v, is_causal=args.causal, block_q=bq, block_k=bk, num_threads=args.threads))
        for bq, bk in tiles
    }
    with threadpool_limits(limits=args.threads, user_api="blas"):
        times = interleaved(contenders, args.repeats)
    print(f"flash_attention forward, float32, B={B} H={H} T=S={T} D={D}, "
          f"{args.threads} thread(s), {args.repeats} interleaved runs")
    report(times, forward_flops(B, H, T, T, D, args.causal))


def option_costs(args: argparse.Namespace) -> None:
    """Flash's forward with each kernel option against plain causal flash, interleaved."""
    B, H, T, D = 1, args.heads, args.seq, args.dim
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, T, D), dtype=np.float32) for _ in range(3))
    slopes = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)  # (H,)
    options: dict[str, dict[str, object]] = {
        "causal": {},
        "causal + softcap=30": {"softcap": 30.0},
        "causal + alibi_slopes (H,)": {"alibi_slopes": slopes},
        "causal + top_left alignment": {"causal_alignment": "top_left"},
        "causal + window=(511, 0)": {"window": (511, 0)},
    }
    contenders = {
        name: (lambda extra=extra: flash_attention(q, k, v, is_causal=True,
                                                   num_threads=args.threads, **extra))
        for name, extra in options.items()
    }
    with threadpool_limits(limits=args.threads, user_api="blas"):
        times = interleaved(contenders, args.repeats)
    print(f"flash_attention forward with the kernel's options, float32, B={B} H={H} T=S={T} "
          f"D={D}, {args.threads} thread(s), {args.repeats} interleaved runs")
    report(times, forward_flops(B, H, T, T, D, True))
    base = statistics.median(w for w, _ in times["causal"])
    for name, runs in times.items():
        print(f"  {name:34s} {statistics.median(w for w, _ in runs) / base:5.2f}x causal's time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, help="T = S for the torch comparison "
                        "(default 4096, 2048 with --backward)")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--long", action="store_true", help="T = S = --long-seq, one head")
    parser.add_argument("--long-seq", type=int, default=65536)
    parser.add_argument("--blocks", nargs="+", metavar="QxK", help="sweep tile sizes instead")
    parser.add_argument("--options", action="store_true",
                        help="the cost of softcap, ALiBi slopes, alignment and a window")
    parser.add_argument("--backward", action="store_true",
                        help="flash_attention_backward vs torch's flash backward")
    args = parser.parse_args()
    if args.seq is None:
        args.seq = 2048 if args.backward else 4096
    if args.backward:
        versus_torch_backward(args)
    elif args.options:
        option_costs(args)
    elif args.long:
        long_sequence(args)
    elif args.blocks:
        block_sweep(args)
    else:
        versus_torch(args)


if __name__ == "__main__":
    main()
