"""Benchmark: attnlab.torch attention against PyTorch's own, forward only, no weights.

CPU (default): ``attnlab.torch.MultiHeadAttention`` vs ``torch.nn.MultiheadAttention``
(``need_weights=False``, batch_first, the same parameters), float32, batch 8,
T = 512, d_model = 384, 12 heads, eval mode, on the same number of threads; once
under ``torch.inference_mode()`` (where torch uses its native fused fast path)
and once with autograd on (a training-style forward). Target: at most 1.1x
torch's time in both.

CUDA (``--device cuda``): bfloat16 at T = 4096 and 16384,
``attnlab.torch.scaled_dot_product_attention`` vs ``F.scaled_dot_product_attention``
(plain and causal) and the two modules. Target: within 5%.

Method: the two contenders run interleaved (A B, then B A, ...) so that drift
in machine load hits both; each repeat times ``--iters`` calls; the script prints
the median of ``--repeats`` repeats, the spread (min .. max), and the ratio of
medians. Outputs are checked to agree before anything is timed.

    python benchmarks/bench_torch_mha.py                 # CPU
    python benchmarks/bench_torch_mha.py --threads 2 --repeats 9
    python benchmarks/bench_torch_mha.py --device cuda   # needs a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import attnlab.torch as at


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with ``n`` intra-op threads, restoring the previous setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def time_cpu(fn: Callable[[], object], iters: int) -> float:
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def time_cuda(fn: Callable[[], object], iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def compare(
    label: str,
    ours: Callable[[], object],
    theirs: Callable[[], object],
    *,
    repeats: int,
    iters: int,
    timer: Callable[[Callable[[], object], int], float],
) -> float:
    """Time both interleaved; print medians, spreads and the ratio; return the ratio."""
    for fn in (ours, theirs):  # warm-up: allocator, kernel selection, caches
        timer(fn, 1)
    times: dict[str, list[float]] = {"attnlab": [], "torch": []}
    for r in range(repeats):
        order = [("attnlab", ours), ("torch", theirs)]
        if r % 2:
            order.reverse()
        for name, fn in order:
            times[name].append(timer(fn, iters))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratio = med["attnlab"] / med["torch"]
    paired = sorted(a / b for a, b in zip(times["attnlab"], times["torch"], strict=True))
    print(f"\n{label}")
    for name, ts in times.items():
        print(f"  {name:8s} median {med[name] * 1e3:9.3f} ms   "
              f"spread {min(ts) * 1e3:9.3f} .. {max(ts) * 1e3:9.3f} ms   (n={len(ts)})")
    print(f"  ratio attnlab/torch (medians) {ratio:.3f}x   "
          f"per-repeat ratios {paired[0]:.3f} .. {paired[-1]:.3f}")
    return ratio


def check_close(a: torch.Tensor, b: torch.Tensor, rtol: float, what: str) -> None:
    err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
    if err > rtol:
        raise SystemExit(f"{what}: outputs differ (relative error {err:.2e} > {rtol:.0e})")


def run_cpu(args: argparse.Namespace) -> None:
    B, T, E, H = args.batch, args.seq, args.d_model, args.heads
    gen = torch.Generator().manual_seed(0)
    ours = at.MultiHeadAttention(H, E, generator=gen).eval()
    theirs = at.to_torch_multihead(ours).eval()
    x = torch.randn(B, T, E, generator=gen)
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; {args.threads} thread(s); float32")
    print(f"MultiHeadAttention forward, B={B}, T={T}, d_model={E}, heads={H}, no weights; "
          f"{args.repeats} repeats x {args.iters} calls, interleaved")
    ratios = []
    with torch_threads(args.threads):
        with torch.inference_mode():
            check_close(ours(x, x, x)[0], theirs(x, x, x, need_weights=False)[0], 1e-5, "MHA")
            # Here nn.MultiheadAttention takes its native fused fast path.
            ratios.append(compare(
                "inference (torch.inference_mode): attnlab.torch.MultiHeadAttention vs "
                "torch.nn.MultiheadAttention(need_weights=False)",
                functools.partial(ours, x, x, x),
                functools.partial(theirs, x, x, x, need_weights=False),
                repeats=args.repeats, iters=args.iters, timer=time_cpu,
            ))
        # With autograd recording (a training forward, eval mode so no dropout),
        # nn.MultiheadAttention goes through F.multi_head_attention_forward instead.
        ratios.append(compare(
            "training-style forward (autograd on): the same two modules",
            functools.partial(ours, x, x, x),
            functools.partial(theirs, x, x, x, need_weights=False),
            repeats=args.repeats, iters=args.iters, timer=time_cpu,
        ))
    worst = max(ratios)
    print(f"\ntarget <= 1.10x: {'met' if worst <= 1.10 else 'NOT met'} (worst {worst:.3f}x)")


def run_cuda(args: argparse.Namespace) -> None:
    if not torch.cuda.is_available():
        raise SystemExit(
            "--device cuda: no CUDA device is available to this PyTorch "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False); "
            "run on a machine with an NVIDIA GPU and a CUDA build of torch, or drop --device"
        )
    dev = torch.device("cuda")
    B, E, H = args.batch, args.d_model, args.heads
    D = E // H
    print(f"GPU: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}; bfloat16; "
          f"B={B}, H={H}, D={D}; {args.repeats} repeats x {args.iters} calls, interleaved")
    gen = torch.Generator(device=dev).manual_seed(0)
    ours_mha = at.MultiHeadAttention(H, E, device=dev, dtype=torch.bfloat16).eval()
    theirs_mha = at.to_torch_multihead(ours_mha).eval()
    worst = 0.0
    with torch.inference_mode():
        for T in args.cuda_seq:
            q, k, v = (torch.randn(B, H, T, D, device=dev, dtype=torch.bfloat16, generator=gen)
                       for _ in range(3))
            x = torch.randn(B, T, E, device=dev, dtype=torch.bfloat16, generator=gen)
            for causal in (False, True):
                check_close(at.scaled_dot_product_attention(q, k, v, is_causal=causal),
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                            2e-2, f"sdpa T={T}")
                ours = functools.partial(at.scaled_dot_product_attention, q, k, v,
                                         is_causal=causal)
                theirs = functools.partial(F.scaled_dot_product_attention, q, k, v,
                                           is_causal=causal)
                ratio = compare(
                    f"scaled_dot_product_attention, T=S={T}, is_causal={causal}", ours, theirs,
                    repeats=args.repeats, iters=args.iters, timer=time_cuda,
                )
                worst = max(worst, ratio)
            ratio = compare(
                f"MultiHeadAttention vs nn.MultiheadAttention, T={T}",
                functools.partial(ours_mha, x, x, x),
                functools.partial(theirs_mha, x, x, x, need_weights=False),
                repeats=args.repeats, iters=args.iters, timer=time_cuda,
            )
            worst = max(worst, ratio)
    print(f"\ntarget <= 1.05x: {'met' if worst <= 1.05 else 'NOT met'} (worst {worst:.3f}x)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(),
                        help="intra-op threads for both contenders (default: torch's current)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats (>= 5)")
    parser.add_argument("--iters", type=int, default=3, help="calls per timed repeat")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512, help="T on CPU")
    parser.add_argument("--cuda-seq", type=int, nargs="+", default=[4096, 16384],
                        help="the T values on CUDA")
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=12)
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats: expected at least 5, for a meaningful median")
    if args.threads < 1 or args.iters < 1:
        parser.error("--threads and --iters: expected at least 1")
    if args.device == "cuda":
        run_cuda(args)
    else:
        run_cpu(args)


if __name__ == "__main__":
    main(sys.argv[1:])
