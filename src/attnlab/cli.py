"""The ``attnlab`` command line.

    attnlab explain                       # seed 000's example, every step printed
    attnlab explain --tokens "小明 去了 学校" --heads 2 --causal --lang zh --out demo/

Bad input ends with a one-line error on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
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


#: Sub-commands: each module ``attnlab.cli_<name>`` has ``add_parser(sub)`` and
#: ``run(args) -> int``. A command's heavy imports happen inside its ``run``.
COMMANDS = ("explain", "inspect", "profile", "approx", "bench")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnlab", description="Self-attention from scratch, step by step.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(f"attnlab.cli_{name}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    try:
        parser = _build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return int(importlib.import_module(f"attnlab.cli_{args.command}").run(args))
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

