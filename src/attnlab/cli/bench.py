"""``attnlab bench``: attention throughput and memory, and KV-cache decoding, measured.

    attnlab bench --quick                       # every section at small sizes, < 1 minute
    attnlab bench                               # the full suite into attnlab-bench/
    attnlab bench --sections attention --lengths 1024,4096 --threads 2 --causal
    attnlab bench --sections generate --prompt-len 512 --new-tokens 512
    attnlab bench --roofline                    # this machine's peaks and each path's share

Prints the tables on stdout, a progress bar on stderr, and writes results.json,
table.txt and PNG plots into ``--out``. ``--roofline`` measures this machine's peaks
(sgemm, exp, memory bandwidth) and each attention path's share of the one that
limits it instead, into roofline.json, roofline.txt and roofline.png
(:mod:`attnlab.studies.roofline`); with ``--quick``, at tiny sizes.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from ..messages import Message, msg, render
from .args import CliError, int_list, prepare_out_dir

DEFAULT_OUT = "attnlab-bench"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark attention (NumPy naive/flash, torch naive/SDPA, attnlab.torch) "
        "and KV-cache decoding",
        description="Measure attention forward throughput (GFLOP/s) and peak memory against "
        "sequence length, decode latency per token with and without the KV cache, and "
        "generation time; write a table, results.json and PNG plots into --out.",
    )
    p.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                   help=f"folder for results.json, table.txt and plots (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true",
                   help="small sizes for every section: finishes in under a minute")
    p.add_argument("--sections", metavar="LIST",
                   help="comma-separated: attention, decode, generate (default all)")
    p.add_argument("--threads", type=int, default=1,
                   help="threads for NumPy's BLAS and torch, the same for all (default 1)")
    p.add_argument("--repeats", type=int, help="timed runs per point; the median and min–max "
                   "are reported (default 5)")
    p.add_argument("--min-time", type=float, metavar="SECONDS",
                   help="a sample lasts at least this long; faster calls are looped "
                   "(default 0.05, --quick 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of inputs and model (default 0)")
    p.add_argument("--roofline", action="store_true",
                   help="measure this machine's peaks (sgemm, exp, memory bandwidth) and each "
                   "attention path's share of its limiting bound instead (~30 s; --quick: tiny "
                   "sizes)")
    p.add_argument("--cpu-time", action="store_true",
                   help="with --roofline: time by the process's CPU time, not wall time (the "
                   "steadier figure at one thread on a shared machine)")
    att = p.add_argument_group("attention")
    att.add_argument("--lengths", metavar="T,T,...",
                     help="sequence lengths T = S (default 256,512,1024,2048,4096; "
                     "--quick 128,256,512)")
    att.add_argument("--contenders", metavar="LIST",
                     help="comma-separated from numpy_naive, numpy_flash, torch_naive, "
                     "torch_sdpa, attnlab_torch (default all)")
    att.add_argument("--batch", type=int, help="B (default 1)")
    att.add_argument("--heads", type=int, help="H (default 8, --quick 4)")
    att.add_argument("--head-dim", type=int, help="D (default 64)")
    att.add_argument("--dtype", choices=["float32", "float64"], help="default float32")
    att.add_argument("--causal", action="store_true", help="causal attention (half the FLOPs)")
    att.add_argument("--max-memory", type=float, metavar="GIB",
                     help="skip naive contenders whose score matrices need more (default 4)")
    att.add_argument("--no-memory", action="store_true", help="do not measure peak memory")
    dec = p.add_argument_group("decode and generate")
    dec.add_argument("--contexts", metavar="S,S,...",
                     help="context lengths for per-token latency (default 128,...,2048; "
                     "--quick 64,...,512)")
    dec.add_argument("--prompt-len", type=int, help="prompt length (default 512, --quick 64)")
    dec.add_argument("--new-tokens", type=int, help="tokens to generate (default 512, --quick 64)")
    dec.add_argument("--generate-repeats", type=int,
                     help="runs of each generation (default 3, --quick 5): an uncached "
                     "512 + 512 run takes minutes")
    p.add_argument("--no-plots", action="store_true", help="write no PNG files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--lang", choices=["en", "zh"], default="en",
                   help="language of the tables and plots (default en)")


def _name_list(text: str, option: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [n for n in names if n not in allowed]
    if not names or unknown:
        raise CliError(msg("cli.names_from", flag=option, names=", ".join(allowed),
                           got=repr(text)))
    return names


def build_config(args: argparse.Namespace) -> Any:
    """The BenchConfig the options describe (quick or full defaults, then overrides)."""
    from ..studies.bench_config import CONTENDERS, SECTIONS, BenchConfig

    overrides: dict[str, Any] = {}
    for option in ("threads", "repeats", "min_time", "seed", "batch", "heads", "head_dim",
                   "dtype", "max_memory", "prompt_len", "new_tokens", "generate_repeats"):
        value = getattr(args, option)
        if value is not None:
            overrides[option] = value
    if args.causal:
        overrides["causal"] = True
    if args.no_memory:
        overrides["measure_memory"] = False
    if args.lengths is not None:
        overrides["lengths"] = int_list(args.lengths, "--lengths")
    if args.contexts is not None:
        overrides["contexts"] = int_list(args.contexts, "--contexts", example="128,512")
    if args.sections is not None:
        overrides["sections"] = _name_list(args.sections, "--sections", SECTIONS)
    if args.contenders is not None:
        overrides["contenders"] = _name_list(args.contenders, "--contenders", CONTENDERS)
    for option in ("threads", "repeats", "batch", "heads", "head_dim", "prompt_len",
                   "generate_repeats"):
        if option in overrides and overrides[option] < 1:
            flag = "--" + option.replace("_", "-")
            raise CliError(msg("check.integer_at_least", name=flag, low=1,
                               got=overrides[option]))
    if "new_tokens" in overrides and overrides["new_tokens"] < 0:
        raise CliError(msg("check.integer_at_least", name="--new-tokens", low=0,
                           got=overrides["new_tokens"]))
    for option in ("min_time", "max_memory"):
        if option in overrides and not 0 <= overrides[option] < float("inf"):
            flag = "--" + option.replace("_", "-")
            raise CliError(msg("cli.number_at_least_0", flag=flag, got=overrides[option]))
    if args.quick:
        return BenchConfig.quick(**overrides)
    return dataclasses.replace(BenchConfig(), **overrides)


class _ProgressBar:
    """A one-line bar redrawn in place on a terminal; a line every 10% otherwise."""

    def __init__(self, stream: Any, lang: str = "en") -> None:
        self.stream = stream
        self.lang = lang
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last_decile = -1

    def __call__(self, done: int, total: int, message: Message) -> None:
        label = message.render(self.lang)
        fraction = done / total if total else 1.0
        if self.tty:
            filled = int(fraction * 30)
            line = f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {label}"
            self.stream.write(line[:100].ljust(100))
            if done >= total:
                self.stream.write("\n")
        else:
            decile = int(fraction * 10)
            if decile > self.last_decile:
                self.last_decile = decile
                self.stream.write(f"[{fraction:4.0%}] {label}\n")
        self.stream.flush()


def run_roofline(args: argparse.Namespace) -> int:
    from ..studies.roofline import RooflineConfig, run_roofline
    from ..studies.roofline_report import format_roofline, write_roofline

    overrides: dict[str, Any] = {}
    for option in ("threads", "repeats"):
        value = getattr(args, option)
        if value is not None:
            if value < 1:
                raise CliError(msg("check.integer_at_least", name=f"--{option}", low=1,
                                   got=value))
            overrides[option] = value
    if args.cpu_time:
        overrides["cpu_time"] = True
    config = (RooflineConfig.quick(**overrides) if args.quick
              else dataclasses.replace(RooflineConfig(), **overrides))
    prepare_out_dir(args.out)
    result = run_roofline(config)
    print(format_roofline(result, args.lang))
    for path in write_roofline(result, args.out, plots=not args.no_plots, lang=args.lang):
        print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.roofline:
        return run_roofline(args)
    from ..studies.bench import run_benchmarks
    from ..studies.bench_report import format_table, write_report

    config = build_config(args)
    prepare_out_dir(args.out)  # now, not after minutes of measuring
    progress = None if args.no_progress else _ProgressBar(sys.stderr, args.lang)
    result = run_benchmarks(config, progress=progress)
    print(format_table(result, args.lang))
    for path in write_report(result, args.out, plots=not args.no_plots, lang=args.lang):
        print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
    return 0
