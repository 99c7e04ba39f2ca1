"""``attnlab explain``: self-attention step by step (seed 000's example by default)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .cli import CliError, parse_matrix


def add_parser(sub: Any) -> None:
    ex = sub.add_parser(
        "explain",
        help="print every step of self-attention (X → Q,K,V → QKᵀ → scale → softmax → ·V)",
        description="Run self-attention step by step. With no options: seed 000's example "
        "X = [[1,0,1,0],[0,2,0,2],[1,1,1,1]], d_k = 3, weights from --seed.",
    )
    ex.add_argument("--tokens", help='token labels, space separated, e.g. "小明 去了 学校"; '
                    "without --x each token gets a deterministic toy embedding")
    ex.add_argument("--x", metavar="MATRIX",
                    help="input X (T×E): inline '1,0,1,0; 0,2,0,2' or JSON, or a .npy/.csv file")
    ex.add_argument("--d-k", type=int, default=3, help="head dim d_k (default 3)")
    ex.add_argument("--d-model", type=int, default=4,
                    help="embedding width for --tokens without --x (default 4)")
    ex.add_argument("--heads", type=int, default=1, help="number of heads (default 1)")
    ex.add_argument("--causal", action="store_true", help="causal mask: no peeking ahead")
    ex.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    ex.add_argument("--init", choices=["normal", "xavier", "xavier_normal"], default="normal",
                    help="weight initialisation (default normal, as the seeds' randn)")
    ex.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the text")
    ex.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                    dest="fmt", help="what to print (default text)")
    ex.add_argument("--precision", type=int, default=4, help="decimals printed (default 4)")
    ex.add_argument("--out", metavar="DIR",
                    help="also write heatmap.png, heatmap.svg, trace.json, trace.md here")


def run(args: argparse.Namespace) -> int:
    from .explain import explain

    tokens = args.tokens.split() if args.tokens is not None else None
    if tokens is not None and not tokens:
        raise CliError("--tokens: expected at least one token, got an empty string")
    X = parse_matrix(args.x) if args.x is not None else None
    if not 0 <= args.precision <= 12:
        raise CliError(f"--precision: expected 0..12, got {args.precision}")
    trace = explain(
        X, tokens=tokens, d_k=args.d_k, d_model=args.d_model, num_heads=args.heads,
        causal=args.causal, seed=args.seed, scheme=args.init,
    )
    if args.fmt == "json":
        print(trace.to_json())
    elif args.fmt == "markdown":
        print(trace.to_markdown(args.lang, precision=args.precision))
    else:
        print(trace.to_text(args.lang, precision=args.precision))
    if args.out:
        written = trace.save(args.out, lang=args.lang)
        label = "已写入" if args.lang == "zh" else "wrote"
        for path in written:
            print(f"{label} {path}", file=sys.stderr)
    return 0
