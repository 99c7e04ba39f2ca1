"""The per-call cost of ``attnlab.torch.scaled_dot_product_attention`` over PyTorch's own.

``attnlab.torch.scaled_dot_product_attention`` vs
``torch.nn.functional.scaled_dot_product_attention`` on CPU, float32, B = 1,
H = 8, D = 64, T = S = 128, 256, ..., 4096, forward only, no mask, one thread
for both (``torch.set_num_threads``, restored afterwards).
Target: attnlab's time within 1.1x of torch's at every T.

What attnlab adds to each call by default: the checks that read only metadata
-- that q, k, v are float tensors (integers are promoted), their number of
dimensions and sizes (k's D matches q's, v's S matches k's, the batch dims
broadcast), one device, the mask's dtype (bool, True = may attend) and
shape, and the flags and the scale -- then the call goes to torch's fused
kernel. Nothing reads the tensors' values and nothing waits for the device, so
the default path costs microseconds and ``torch.compile`` sees no host sync.

``attnlab.torch.debug_checks()`` (a context manager, like
``torch.autograd.detect_anomaly``; it restores the previous setting on exit)
adds the checks that read every value: q, k, v (and every module's inputs)
hold no NaN or Inf, a bias holds no NaN or +inf, and the scores
``q·kᵀ·scale + bias`` cannot overflow the dtype (which would make a row NaN).
Each forces a host sync. Without it, a non-finite input propagates as it does
in torch. ``--debug-checks`` times attnlab inside it.

Method: the two run interleaved (A B, then B A, ...) so that drift in machine
load hits both; each repeat times enough calls to last ``--min-time`` seconds;
the script prints the median of ``--repeats`` repeats per contender, the spread
and the ratio of medians per T. Outputs are checked to agree before timing.

    python benchmarks/bench_torch_sdpa.py                  # 1 thread, T = 128 .. 4096
    python benchmarks/bench_torch_sdpa.py --threads 2 --causal
    python benchmarks/bench_torch_sdpa.py --lengths 64 128 --batch 8 --debug-checks
    python benchmarks/bench_torch_sdpa.py --lengths 64 256 1024 --mask padding --backward

``--mask padding`` passes a (B, 1, 1, S) bool key-padding mask (the last quarter of the
keys padded), ``--mask full`` a (B, H, T, S) bool mask, to both; ``--backward`` times
forward + backward (the sum of the output, gradients for q, k and v).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import attnlab.torch as at

TARGET = 1.10


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


def per_call(fn: Callable[[], object], iters: int) -> float:
    """Seconds per call, averaged over ``iters`` calls."""
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def calls_for(fn: Callable[[], object], min_time: float) -> int:
    """How many calls make one repeat last about ``min_time`` seconds."""
    one = per_call(fn, 1)
    return max(1, round(min_time / max(one, 1e-9)))


def interleaved(
    ours: Callable[[], object], theirs: Callable[[], object], repeats: int, min_time: float
) -> tuple[list[float], list[float]]:
    """Seconds per call of each, from ``repeats`` repeats run in alternating order."""
    for fn in (ours, theirs):  # warm-up: allocator, kernel selection, caches
        per_call(fn, 2)
    iters = calls_for(theirs, min_time)
    times: dict[str, list[float]] = {"attnlab": [], "torch": []}
    for r in range(repeats):
        order = [("attnlab", ours), ("torch", theirs)]
        if r % 2:
            order.reverse()
        for name, fn in order:
            times[name].append(per_call(fn, iters))
    return times["attnlab"], times["torch"]


def torch_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               *, is_causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[128, 256, 512, 1024, 2048, 4096], help="T = S values")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--causal", action="store_true", help="is_causal=True for both")
    parser.add_argument("--mask", choices=["none", "padding", "full"], default="none",
                        help="a bool mask for both (default none)")
    parser.add_argument("--backward", action="store_true", help="time forward + backward")
    parser.add_argument("--debug-checks", action="store_true",
                        help="time attnlab inside attnlab.torch.debug_checks()")
    parser.add_argument("--repeats", type=int, default=9, help="timed repeats (>= 5)")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds per timed repeat (more calls at small T)")
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats: expected at least 5, for a meaningful median")
    if args.threads < 1 or min(args.lengths) < 1:
        parser.error("--threads and --lengths: expected values >= 1")

    B, H, D = args.batch, args.heads, args.head_dim
    print(f"CPU: {cpu_name()}; torch {torch.__version__}; {args.threads} thread(s); float32; "
          f"B={B}, H={H}, D={D}, is_causal={args.causal}, mask={args.mask}, "
          f"backward={args.backward}, debug_checks={args.debug_checks}; "
          f"median of {args.repeats} interleaved repeats")
    print(f"{'T = S':>6}  {'attnlab ms':>11}  {'torch ms':>9}  {'overhead us':>11}  "
          f"{'ratio':>6}  {'per-repeat ratios':>17}")
    gen = torch.Generator().manual_seed(0)
    checks = at.debug_checks if args.debug_checks else contextlib.nullcontext
    worst = 0.0
    with torch_threads(args.threads), checks():
        for T in args.lengths:
            q, k, v = (torch.randn(B, H, T, D, generator=gen).requires_grad_(args.backward)
                       for _ in range(3))
            mask = None
            if args.mask == "padding":
                mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
                mask[..., T - T // 4:] = False  # (B, 1, 1, S): the last quarter padded
            elif args.mask == "full":
                mask = torch.rand(B, H, T, T, generator=gen) > 0.25  # (B, H, T, S)
                mask[..., 0] = True  # no empty row, so that both define every output

            def run(fn: Callable[..., torch.Tensor], q=q, k=k, v=v, mask=mask) -> torch.Tensor:
                out = fn(q, k, v, mask, is_causal=args.causal)
                if args.backward:
                    out.sum().backward()
                return out

            def ours(run=run) -> object:
                return run(at.scaled_dot_product_attention)

            def theirs(run=run) -> object:
                return run(torch_sdpa)

            error = float((ours() - theirs()).abs().max())
            if error > 1e-5:
                raise SystemExit(f"T={T}: outputs differ by {error:.2e}")
            mine, torchs = interleaved(ours, theirs, args.repeats, args.min_time)
            med_ours, med_torch = statistics.median(mine), statistics.median(torchs)
            ratio = med_ours / med_torch
            paired = sorted(a / b for a, b in zip(mine, torchs, strict=True))
            worst = max(worst, ratio)
            print(f"{T:6d}  {med_ours * 1e3:11.3f}  {med_torch * 1e3:9.3f}  "
                  f"{(med_ours - med_torch) * 1e6:11.1f}  {ratio:5.3f}x  "
                  f"{paired[0]:.3f} .. {paired[-1]:.3f}")
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"target <= {TARGET:.2f}x at every T: {verdict} (worst {worst:.3f}x)")


if __name__ == "__main__":
    main(sys.argv[1:])
