"""The ``attnlab`` command line.

    attnlab explain                       # seed 000's example, every step printed
    attnlab explain --tokens "小明 去了 学校" --heads 2 --causal --lang zh --out demo/

Bad input ends with a one-line error on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import AttnlabError

EXIT_USAGE = 2
EXIT_INTERNAL = 1


class CliError(Exception):
    """A user-facing error of the command line (printed in one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own errors: one line, exit 2
        raise CliError(f"{self.prog}: {message}")


def parse_matrix(text: str) -> np.ndarray:
    """``--x``: a .npy or .csv file, or an inline matrix: "1,0,1,0; 0,2,0,2" or JSON."""
    path = Path(text)
    if text.endswith(".npy"):
        if not path.is_file():
            raise CliError(f"--x: file not found: {text}")
        try:
            return np.asarray(np.load(path, allow_pickle=False))
        except (ValueError, OSError) as exc:
            raise CliError(f"--x: could not read {text} as a .npy array ({exc})") from None
    if text.endswith((".csv", ".txt")):
        if not path.is_file():
            raise CliError(f"--x: file not found: {text}")
        try:
            return np.atleast_2d(np.loadtxt(path, delimiter=",", ndmin=2))
        except ValueError as exc:
            raise CliError(f"--x: could not read {text} as a numeric CSV ({exc})") from None
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            rows = json.loads(stripped)
        else:
            rows = [[float(x) for x in row.replace(",", " ").split()]
                    for row in stripped.split(";") if row.strip()]
        matrix = np.array(rows, dtype=np.float64)
    except (ValueError, TypeError):
        raise CliError(
            f"--x: expected a matrix like '1,0,1,0; 0,2,0,2' or '[[1,0],[0,1]]' "
            f"or a .npy/.csv file, got {text!r}"
        ) from None
    if matrix.ndim != 2:
        raise CliError(f"--x: expected a 2-D matrix (rows = tokens), got shape {matrix.shape}")
    return matrix


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnlab", description="Self-attention from scratch, step by step.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
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
    return parser


def _cmd_explain(args: argparse.Namespace) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return {"explain": _cmd_explain}[args.command](args)
    except (CliError, AttnlabError) as exc:
        print(f"error: {exc}".replace("\n", " "), file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback: say what broke, in one line
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
