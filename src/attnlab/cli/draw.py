"""``attnlab draw``: a picture for a concept (multi-head attention's data flow, flash
tiles, the KV cache, positional encodings, sparse and low-rank patterns)."""

from __future__ import annotations

import argparse
from typing import Any

from ..messages import msg, render
from .args import CliError, prepare_out_dir, text_argument

NAMES = ("dataflow", "flash", "kvcache", "positions", "sparse")
#: the options that size the data-flow drawing (and nothing else)
_SIZES = (("tokens", "--tokens"), ("heads", "--heads"), ("d_model", "--d-model"))


def add_parser(sub: Any) -> None:
    dr = sub.add_parser(
        "draw",
        help="draw a concept: multi-head data flow, flash tiles, the KV cache, positional "
        "encodings, sparse patterns",
        description="Draw one concept as a PNG: dataflow (multi-head attention from X to "
        "the output with every tensor's shape, and the post-LN and pre-LN residual blocks), "
        "flash (key tiles with the running max and "
        "sum, step by step), kvcache (what a full cache and a rolling window hold after "
        "each decoding step), positions (sinusoidal table, RoPE angles and relative "
        "scores), sparse (the keys a window, a global token and BigBird blocks keep; "
        "Linformer's and Nyström's weights beside the exact ones).",
    )
    dr.add_argument("names", nargs="+", choices=[*NAMES, "all"], metavar="NAME",
                    help=f"one or more of {', '.join(NAMES)}, or all")
    dr.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the text")
    dr.add_argument("--out", metavar="DIR", default=".",
                    help="folder for NAME.png (default: the current folder)")
    dr.add_argument("--tokens", help='dataflow only: token labels, space separated, e.g. '
                    '"小明 去了 学校"; their number is T in the shapes (default 3 tokens)')
    dr.add_argument("--heads", type=int, help="dataflow only: number of heads H (default 2)")
    dr.add_argument("--d-model", type=int,
                    help="dataflow only: model width E, a multiple of --heads (default 8)")


def run(args: argparse.Namespace) -> int:
    from ..report.concepts import draw_all
    from ..report.dataflow import draw_dataflow
    from ..report.figures import save_figure

    names = list(NAMES) if "all" in args.names else list(dict.fromkeys(args.names))
    given = [flag for attr, flag in _SIZES if getattr(args, attr) is not None]
    if given and "dataflow" not in names:
        raise CliError(msg("cli.draw_sizes", flag=given[0], names=" ".join(names)))
    sizes: dict[str, int] = {}
    if args.tokens is not None:
        sizes["T"] = len(text_argument(args.tokens, "--tokens").split())
        if not sizes["T"]:
            raise CliError(msg("cli.tokens_empty"))
    if args.heads is not None:
        sizes["num_heads"] = args.heads
    if args.d_model is not None:
        sizes["d_model"] = args.d_model
    folder = prepare_out_dir(args.out)
    paths = []
    for name in names:
        if name == "dataflow":
            figure = draw_dataflow(args.lang, **sizes)
            paths.append(save_figure(figure, folder / "dataflow.png"))
        else:
            paths.extend(draw_all(folder, lang=args.lang, names=[name]))
    for path in paths:
        print(render("cli.wrote", args.lang, path=path))
    return 0
