"""``attnlab ring``: ring attention across W local processes, or simulated step by step.

    attnlab ring --world-size 4 --seq 16384 --heads 8 --layout zigzag --causal
    attnlab ring --world-size 4 --seq 32 --heads 2 --layout contiguous --causal --simulate
    attnlab ring --world-size 4 --seq 64 --causal --simulate --lang zh --out ring/

Without ``--simulate`` it spawns W gloo processes on this machine (CPU) and prints
each rank's peak memory, the time of each ring step, the work imbalance (max / min
rank compute time), the bytes sent and the error against single-process attention.
With ``--simulate`` it runs the NumPy virtual ring and prints what each rank holds,
computes and merges at every step (``--out``: also the ranks × steps picture).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..distributed.layouts import LAYOUTS
from ..messages import msg, render
from .args import CliError, check_memory, prepare_out_dir


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "ring",
        help="ring attention over W local processes (gloo), or its NumPy simulation",
        description="Split a random sequence across W ranks and compute attention with "
        "K/V shards rotating around the ring: on W spawned gloo processes (per-rank "
        "memory, time per step, work imbalance, bytes sent, error against one process), "
        "or with --simulate in NumPy, every step explained.",
    )
    p.add_argument("--world-size", type=int, default=4, help="ranks W (default 4)")
    p.add_argument("--seq", type=int, default=4096,
                   help="sequence length T, a multiple of W (2W for zigzag) (default 4096)")
    p.add_argument("--heads", type=int, default=8, help="query heads H (default 8)")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="key/value heads Hkv, dividing H (default H)")
    p.add_argument("--head-dim", type=int, default=64, help="head dim D (default 64)")
    p.add_argument("--batch", type=int, default=1, help="batch B (default 1)")
    p.add_argument("--layout", choices=LAYOUTS, default="zigzag",
                   help="how positions are split over ranks (default zigzag)")
    p.add_argument("--causal", action="store_true", help="causal attention")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--backward", action="store_true",
                   help="also run the backward (processes only)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measured calls per rank after a warm-up; the median is shown "
                   "(default 3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the processes are stopped (default 600)")
    p.add_argument("--simulate", action="store_true",
                   help="run the NumPy virtual ring instead of processes, every step printed")
    p.add_argument("--lang", choices=("en", "zh"), default="en",
                   help="language of the simulation's report (default en)")
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.add_argument("--out", metavar="DIR",
                   help="with --simulate: also write ring.png (ranks × steps) and ring.txt here")


def _positive(value: int, option: str) -> int:
    if value < 1:
        raise CliError(msg("cli.positive", flag=option, got=value))
    return value


def _settings(args: argparse.Namespace) -> Any:
    from ..distributed.layouts import check_length
    from ..studies.ring import RingSettings

    W = _positive(args.world_size, "--world-size")
    T = _positive(args.seq, "--seq")
    H = _positive(args.heads, "--heads")
    Hkv = H if args.kv_heads is None else _positive(args.kv_heads, "--kv-heads")
    if H % Hkv:
        raise CliError(msg("ring.kv_heads", heads=H, kv_heads=Hkv))
    D = _positive(args.head_dim, "--head-dim")
    B = _positive(args.batch, "--batch")
    threads = _positive(args.threads, "--threads")
    repeats = _positive(args.repeats, "--repeats")
    if args.seed < 0:
        raise CliError(msg("check.integer_at_least", name="--seed", low=0, got=args.seed))
    if not args.timeout > 0:
        raise CliError(msg("cli.timeout", got=args.timeout))
    check_length(T, W, args.layout, "--seq")
    itemsize = 8 if args.dtype == "float64" else 4
    # Inputs in full on every rank while sharding, plus the scores of a 1024-row chunk.
    per_rank = itemsize * B * (3 * H * T * D + H * min(T // W, 1024) * (T // W) * 3)
    check_memory((1 if args.simulate else W) * per_rank, "--seq/--heads/--world-size",
                 f"T = {T}, H = {H}, W = {W}")
    return RingSettings(world_size=W, seq=T, heads=H, kv_heads=Hkv, head_dim=D, batch=B,
                        layout=args.layout, is_causal=args.causal, dtype=args.dtype,
                        seed=args.seed, threads=threads, backward=args.backward,
                        repeats=repeats)


def run(args: argparse.Namespace) -> int:
    if args.out is not None and not args.simulate:  # it used to be ignored without a word
        raise CliError(msg("ring.out_needs_simulate"))
    settings = _settings(args)
    folder = prepare_out_dir(args.out) if args.out is not None else None
    if args.simulate:
        return _run_simulation(settings, args, folder)
    from ..studies.ring import measure_ring

    result = measure_ring(settings, timeout=args.timeout)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_measurement(result))
    return 0


def _run_simulation(settings: Any, args: argparse.Namespace, folder: Any) -> int:
    from ..report.ring import ring_text
    from ..studies.ring import simulate_ring

    sim, error = simulate_ring(settings)
    text = ring_text(sim.report, args.lang)
    label = "与单进程 flash 注意力的最大误差" if args.lang == "zh" else \
        "max error against single-process flash attention"
    text += f"\n{label}: {error:.3g}"
    if args.json:
        report = sim.report
        print(json.dumps({"work": report.work().tolist(),
                          "flops_per_rank": report.flops_per_rank().tolist(),
                          "imbalance": report.imbalance(), "kv_bytes": report.kv_bytes,
                          "error": error}, indent=2))
    else:
        print(text)
    if folder is not None:
        (folder / "ring.txt").write_text(text + "\n", encoding="utf-8")
        print(render("cli.wrote", args.lang, path=folder / "ring.txt"), file=sys.stderr)
        try:
            from ..report.figures import save_figure
            from ..report.ring import ring_figure

            png = save_figure(ring_figure(sim.report, args.lang), folder / "ring.png")
            print(render("cli.wrote", args.lang, path=png), file=sys.stderr)
        except ImportError as exc:
            print(render("cli.no_plot", args.lang, reason=exc), file=sys.stderr)
    return 0


def _mib(size: int | None) -> str:
    return "n/a" if size is None else f"{size / 2**20:,.1f} MiB"


def format_measurement(result: dict[str, Any]) -> str:
    """The terminal table of :func:`attnlab.studies.ring.measure_ring`'s result."""
    s = result["settings"]
    W = s["world_size"]
    lines = [f"attnlab ring · W = {W} gloo processes · {s['layout']} · "
             f"{'causal' if s['is_causal'] else 'no mask'} · B={s['batch']} H={s['heads']} "
             f"Hkv={s['kv_heads']} T={s['seq']} D={s['head_dim']} · {s['dtype']} · "
             f"{s['threads']} thread(s) per rank · "
             f"{'forward + backward' if s['backward'] else 'forward'} · median of {s['repeats']}",
             "", "  rank   peak memory    total    " + "".join(
                 f"step {i:<2} ms   " for i in range(W)) + "wait ms   sent"]
    for r in result["ranks"]:
        steps = "".join(f"{1e3 * c:>10.1f}   " for c in r["step_compute_s"])
        lines.append(f"  {r['rank']:>4} {_mib(r['peak_bytes']):>13} {r['seconds']:>8.3f} s "
                     f"{steps}{1e3 * sum(r['step_wait_s']):>7.1f}   {_mib(r['bytes_sent'])}")
    lines += ["", f"work imbalance (max / min rank compute time): {result['imbalance']:.2f}",
              f"each rank sent {W - 1} K/V shards in the forward"]
    if result["error"] is not None:
        lines.append(f"max error against single-process attention: {result['error']:.3g}")
    return "\n".join(lines)
