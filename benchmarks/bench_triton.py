"""Benchmark: attnlab.triton's flash attention against PyTorch's best, in TFLOP/s, on a GPU.

Contenders, all bfloat16, q, k, v (B, H, T, D) with T = S:

- ``attnlab.triton.flash_attention`` (Triton kernels, autotuned on first use of a shape);
- ``F.scaled_dot_product_attention`` held to its flash backend
  (``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``);
- ``flex``: FlexAttention, ``torch.compile(flex_attention)`` with a causal ``BlockMask``
  where causal (its Triton templates: the known yardstick, ~85-90% of FlashAttention-2;
  eager in ``--dry-run``).

Grid: D = 64 and 128; T = 1k, 2k, 4k, 8k, 16k; causal and not; forward and
forward+backward. H = 16 and B·T = 32·1024 tokens (B = 32 at T = 1k, scaled down as
T grows so that every T fits), i.e. B·H = 32·16 at T = 1k.

Outputs are checked against SDPA's first (``TOLERANCE``); a contender that
disagrees is reported WRONG and not timed.

FLOPs (Triton's fused-attention tutorial and FlashAttention's convention): the
forward is 4·B·H·T·S·D (two matmuls), halved when causal; the backward is 2.5x
the forward, so forward+backward counts 3.5x. TFLOP/s = FLOPs / median time.
Times are ``triton.testing.do_bench`` medians (CUDA events, L2 flushed between
runs).

Targets (H100/H200 class): forward >= 0.8x SDPA-flash at T = 4k-16k, D = 128;
forward+backward >= 0.7x. The script prints both ratios per row and the verdict.

It then reruns ``benchmarks/bench_torch_mha.py`` on the same device and keeps its
output in the JSON. ``--budget-s`` (default 290 s) bounds the
grid (no row starts after it), then gives the rerun 120 s, so that the whole
run stays under 8 minutes; rows not reached are listed as skipped. The target
rows (D = 128, long T) run first.

    python benchmarks/bench_triton.py --device cuda              # table + bench_triton.json
    python benchmarks/bench_triton.py --device cuda --json out.json --no-mha
    python benchmarks/bench_triton.py --dry-run                  # CPU, Triton's interpreter:
                                                                 # tiny shapes, plumbing only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: Outputs must agree with SDPA's to this before they are timed: two independent
#: bfloat16 roundings of out (|out| < ~1 on unit-normal inputs, bfloat16's spacing
#: below 1 is <= 2^-8) plus P rounded to bfloat16 before P·V in every kernel.
TOLERANCE = 3e-2
TOKENS = 32 * 1024  # B·T
HEADS = 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU through Triton's interpreter, tiny float16 shapes, eager "
                             "FlexAttention, timings meaningless: checks that the script runs")
    parser.add_argument("--json", type=Path, default=Path("bench_triton.json"))
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--lengths", type=int, nargs="+",
                        default=[16384, 8192, 4096, 2048, 1024])
    parser.add_argument("--budget-s", type=float, default=290.0,
                        help="start no new row after this many seconds (default 290; the "
                             "bench_torch_mha.py rerun then has 120 s)")
    parser.add_argument("--no-mha", action="store_true",
                        help="skip the rerun of bench_torch_mha.py")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
        args.head_dims, args.lengths = [16], [64]
    elif args.device == "cpu":
        parser.error("--device cpu: the kernels need a GPU; use --dry-run to check the script "
                     "on a CPU (Triton's interpreter)")
    return args


ARGS = parse_args(sys.argv[1:]) if __name__ == "__main__" else None
if ARGS is not None and ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported, below

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from attnlab.triton import flash_attention  # noqa: E402

if ARGS is not None and not ARGS.dry_run:
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention as _flex

    # One compile per shape and mode (dynamic=False: FlexAttention's fastest kernels); the
    # grid has 20 shapes x 2 modes, past dynamo's default limit of 8 recompiles, after
    # which it would silently run FlexAttention eagerly (a full (T, S) score matrix).
    for limit in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)
    COMPILED_FLEX = torch.compile(_flex, dynamic=False)


def median_ms(fn: Callable[[], object], device: str) -> float:
    """Median time of one call in milliseconds."""
    fn()  # warm-up outside the timing: autotuning, torch.compile, the allocator
    if device == "cuda":
        import triton.testing

        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def contenders(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               dry_run: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a forward call on (q, k, v)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, T, _ = q.shape
    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, B=None, H=None,
                                       Q_LEN=T, KV_LEN=k.shape[2], device=q.device)
    if dry_run:  # eager on purpose: the dry run checks the plumbing, not the speed
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    flex = flex_attention if dry_run else COMPILED_FLEX

    def sdpa() -> torch.Tensor:
        if dry_run:  # CPU: whichever kernel torch picks; the flash backend is CUDA's
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    # FlexAttention has no backward on CPU: the dry run times its forward only, on
    # detached inputs.
    fq, fk, fv = (t.detach() for t in (q, k, v)) if dry_run else (q, k, v)
    return {
        "attnlab.triton": lambda: flash_attention(q, k, v, is_causal=causal),
        "sdpa-flash": sdpa,
        "flex": lambda: flex(fq, fk, fv, block_mask=block_mask),  # type: ignore[misc]
    }


def run_row(D: int, T: int, causal: bool, device: str, dtype: torch.dtype,
            dry_run: bool) -> dict[str, Any]:
    B = max(1, TOKENS // T) if not dry_run else 1
    H = HEADS if not dry_run else 2
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, device=device, dtype=dtype, generator=gen)
               .requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=gen)
    calls = contenders(q, k, v, causal, dry_run)
    flops_fwd = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
    row: dict[str, Any] = {"D": D, "T": T, "S": T, "B": B, "H": H, "causal": causal,
                           "dtype": str(dtype).removeprefix("torch."), "results": {}}
    with torch.no_grad():
        reference = calls["sdpa-flash"]().float()
    for name, call in calls.items():
        with torch.no_grad():
            err = (call().float() - reference).abs().max().item()
        if not err <= TOLERANCE:  # (NaN too)
            print(f"  {name}: output differs from SDPA's by {err:.3g} > {TOLERANCE} at D={D}, "
                  f"T={T}, causal={causal}: not timed", flush=True)
            row["results"][name] = {"max_abs_diff_vs_sdpa": err, "wrong": True}
            continue

        def forward_backward(call: Callable[[], torch.Tensor] = call) -> None:
            call().backward(dout)
            for t in (q, k, v):
                t.grad = None

        with torch.no_grad():
            fwd_ms = median_ms(call, device)
        trains = not (dry_run and name == "flex")
        both_ms = median_ms(forward_backward, device) if trains else None
        row["results"][name] = {
            "max_abs_diff_vs_sdpa": err,
            "fwd_ms": fwd_ms, "fwd_tflops": flops_fwd / fwd_ms / 1e9,
            "fwd_bwd_ms": both_ms,
            "fwd_bwd_tflops": None if both_ms is None else 3.5 * flops_fwd / both_ms / 1e9,
        }
    base = row["results"]["sdpa-flash"]
    for result in row["results"].values():
        if result.get("wrong"):
            continue
        result["fwd_vs_sdpa"] = result["fwd_tflops"] / base["fwd_tflops"]
        result["fwd_bwd_vs_sdpa"] = (None if result["fwd_bwd_tflops"] is None
                                     else result["fwd_bwd_tflops"] / base["fwd_bwd_tflops"])
    return row


def _number(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def print_row(row: dict[str, Any]) -> None:
    cells = []
    for name, r in row["results"].items():
        if r.get("wrong"):
            cells.append(f"{name} WRONG (max |diff| {r['max_abs_diff_vs_sdpa']:.3g})")
            continue
        cells.append(f"{name} {r['fwd_tflops']:7.1f} / {_number(r['fwd_bwd_tflops'], '7.1f')} "
                     f"({r['fwd_vs_sdpa']:.2f}x / {_number(r['fwd_bwd_vs_sdpa'], '.2f')}x)")
    print(f"D={row['D']:4d} T={row['T']:6d} B={row['B']:3d} causal={row['causal']!s:5s} | "
          + " | ".join(cells), flush=True)


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The targets over the rows they concern (D = 128, T = 4k-16k)."""
    target_rows = [r for r in rows if r["D"] == 128 and 4096 <= r["T"] <= 16384]
    if not target_rows:
        return {"rows": 0}
    ours = [r["results"]["attnlab.triton"] for r in target_rows]
    if any(r.get("wrong") for r in ours):
        return {"rows": len(target_rows), "wrong": True}
    fwd = min(r["fwd_vs_sdpa"] for r in ours)
    both = min(r["fwd_bwd_vs_sdpa"] for r in ours)
    return {"rows": len(target_rows), "worst_fwd_vs_sdpa": fwd, "fwd_target_0.8_met": fwd >= 0.8,
            "worst_fwd_bwd_vs_sdpa": both, "fwd_bwd_target_0.7_met": both >= 0.7}


def rerun_mha(device: str, dry_run: bool) -> dict[str, Any]:
    command = [sys.executable, str(HERE / "bench_torch_mha.py"), "--device", device]
    if dry_run:
        command += ["--batch", "1", "--seq", "16", "--repeats", "5", "--iters", "1"]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    except subprocess.TimeoutExpired as error:
        print(f"bench_torch_mha.py: stopped after {error.timeout:.0f} s", file=sys.stderr)
        return {"command": command[1:], "returncode": None, "timed_out": True,
                "stdout": (error.stdout or b"").decode(errors="replace")
                if isinstance(error.stdout, bytes) else (error.stdout or "")}
    print(result.stdout, end="")
    print(result.stderr, end="", file=sys.stderr)
    return {"command": command[1:], "returncode": result.returncode, "stdout": result.stdout,
            "stderr": result.stderr[-4000:]}


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    device, dtype = args.device, (torch.float16 if args.dry_run else torch.bfloat16)
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False; run on a machine "
                         "with an NVIDIA GPU and a CUDA build of torch (or --dry-run on a CPU)")
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU, Triton's interpreter"
    print(f"{where}; torch {torch.__version__}; {str(dtype).removeprefix('torch.')}; "
          f"TFLOP/s forward / forward+backward (ratio to sdpa-flash)", flush=True)
    plan = [(D, T, causal) for D in args.head_dims for T in args.lengths
            for causal in (True, False)]
    rows, skipped = [], []
    for D, T, causal in plan:
        if time.perf_counter() - start > args.budget_s:
            skipped.append({"D": D, "T": T, "causal": causal})
            continue
        row = run_row(D, T, causal, device, dtype, args.dry_run)
        print_row(row)
        rows.append(row)
    if skipped:
        print(f"skipped (over --budget-s {args.budget_s:.0f} s): "
              + ", ".join(f"D={s['D']} T={s['T']} causal={s['causal']}" for s in skipped))
    result = verdict(rows)
    if result.get("wrong"):
        print("targets: attnlab.triton gave wrong outputs on a target row (see above)")
    elif result["rows"]:
        print(f"targets at D=128, T=4k-16k: forward worst {result['worst_fwd_vs_sdpa']:.2f}x "
              f"(>= 0.8x: {'met' if result['fwd_target_0.8_met'] else 'NOT met'}), "
              f"forward+backward worst {result['worst_fwd_bwd_vs_sdpa']:.2f}x "
              f"(>= 0.7x: {'met' if result['fwd_bwd_target_0.7_met'] else 'NOT met'})")
    report: dict[str, Any] = {
        "device": where, "torch": torch.__version__, "dry_run": args.dry_run,
        "flops": "forward 4*B*H*T*S*D (x0.5 causal); forward+backward 3.5x that",
        "rows": rows, "skipped": skipped, "verdict": result,
    }
    report["grid_seconds"] = time.perf_counter() - start
    if not args.no_mha:
        report["bench_torch_mha"] = rerun_mha(device, args.dry_run)
    report["total_seconds"] = time.perf_counter() - start
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json} ({report['total_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    assert ARGS is not None
    sys.exit(main(ARGS))
