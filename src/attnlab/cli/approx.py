"""``attnlab approx``: the approximation study (sparse and low-rank attention vs exact)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..messages import Message, msg, render
from .args import CliError, check_memory, int_list, prepare_out_dir


def add_parser(sub: Any) -> None:
    ap = sub.add_parser(
        "approx",
        help="measure sparse and low-rank attention against exact attention "
             "(error, time, peak memory)",
        description="The approximation study: sliding window, block-sparse (BigBird), "
        "Linformer, Nyström and Performer, each at several knob values and lengths, on "
        "near-uniform and peaked Gaussian inputs and on real MiniLM Q/K/V. Prints a table "
        "and where each method is worse than exact attention; --out also writes approx.json "
        "and PNG plots. Timings are medians of N interleaved runs on this machine: close "
        "other work first.",
    )
    ap.add_argument("--quick", action="store_true",
                    help="T = 256 and 1024, two values per knob, no T = 16,384 check "
                         "(under a minute)")
    ap.add_argument("--out", metavar="DIR",
                    help="write approx.json, error_vs_time.png, error_vs_memory.png, "
                         "time_vs_length.png and patterns.png here")
    ap.add_argument("--lengths", metavar="T,T,...",
                    help="Gaussian-input lengths (default 256,1024,4096; quick 256,1024)")
    ap.add_argument("--minilm-lengths", metavar="T,T,...",
                    help="MiniLM-input lengths, at most 256 (default 128,256)")
    ap.add_argument("--no-minilm", action="store_true",
                    help="skip the real MiniLM Q/K/V input")
    ap.add_argument("--long", type=int, metavar="T",
                    help="length of the causal long-sequence check (default 16384; "
                         "0 = skip; quick skips it)")
    ap.add_argument("--repeats", type=int, help="timed runs per measurement (default 3)")
    ap.add_argument("--threads", type=int, default=1,
                    help="BLAS threads, via threadpoolctl (default 1; 0 = leave unchanged)")
    ap.add_argument("--seed", type=int, default=0, help="seed of inputs and projections")
    ap.add_argument("--lang", choices=["en", "zh"], default="en",
                    help="language of the tables and plots (default en)")


def run(args: argparse.Namespace) -> int:
    from ..studies.approx import StudyConfig, run_study
    from ..studies.approx_report import format_table, save_study

    changes: dict[str, Any] = {"seed": args.seed, "minilm": not args.no_minilm}
    if args.threads < 0:
        raise CliError(msg("cli.approx_threads", got=args.threads))
    changes["threads"] = args.threads or None
    if args.lengths is not None:
        changes["lengths"] = int_list(args.lengths, "--lengths")
    if args.minilm_lengths is not None:
        changes["minilm_lengths"] = int_list(args.minilm_lengths, "--minilm-lengths",
                                             example="128,256")
    if args.long is not None:
        if args.long < 0:
            raise CliError(msg("cli.approx_long", got=args.long))
        changes["long_length"] = args.long or None
    if args.repeats is not None:
        changes["repeats"] = args.repeats
    config = (StudyConfig.quick(**changes) if args.quick else StudyConfig(**changes)).check()
    # Exact attention, the baseline: float64 scores and weights (and a temporary) at the
    # longest Gaussian length; float32 at the long-sequence check.
    needs = [(24 * T * T, "--lengths", msg("cli.approx_exact_at", T=T)) for T in config.lengths]
    if config.long_length is not None:
        T = config.long_length
        needs.append((12 * T * T, "--long", msg("cli.approx_dense_at", T=T)))
    for nbytes, flag, what in needs:
        check_memory(nbytes, flag, what)
    if args.out is not None:
        prepare_out_dir(args.out)

    def progress(line: Message) -> None:
        print(f"... {line.render(args.lang)}", file=sys.stderr, flush=True)

    result = run_study(config, progress=progress)
    print(format_table(result, args.lang))
    if args.out is not None:
        for path in save_study(result, args.out, lang=args.lang):
            print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
    else:
        print(render("cli.approx_pass_out", args.lang), file=sys.stderr)
    return 0
