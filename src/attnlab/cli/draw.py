"""``attnlab draw``: a picture for a concept (flash tiles, the KV cache, positional
encodings, sparse and low-rank patterns)."""

from __future__ import annotations

import argparse
from typing import Any

from .args import prepare_out_dir

NAMES = ("flash", "kvcache", "positions", "sparse")


def add_parser(sub: Any) -> None:
    dr = sub.add_parser(
        "draw",
        help="draw a concept: flash tiles, the KV cache, positional encodings, sparse patterns",
        description="Draw one concept as a PNG: flash (key tiles with the running max and "
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


def run(args: argparse.Namespace) -> int:
    from ..report.concepts import draw_all

    names = list(NAMES) if "all" in args.names else list(dict.fromkeys(args.names))
    folder = prepare_out_dir(args.out)
    label = "已写入" if args.lang == "zh" else "wrote"
    for path in draw_all(folder, lang=args.lang, names=names):
        print(f"{label} {path}")
    return 0
