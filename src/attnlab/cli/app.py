"""The ``attnlab`` command line.

    attnlab explain                       # seed 000's example, every step printed
    attnlab explain --tokens "小明 去了 学校" --heads 2 --causal --lang zh --out demo/

Bad input ends with a one-line error on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import AttnlabError
from . import approx, bench, draw, explain, inspect, profile, train
from . import lens as lens_command
from . import ring as ring_command
from . import verify as verify_command
from .args import CliError, Parser
from .help_zh import localize_error, localize_parser, wants_chinese

EXIT_USAGE = 2
EXIT_INTERNAL = 1


#: The command table: name -> module with ``add_parser(sub)`` and ``run(args) -> int``.
#: Each command's heavy imports happen inside its ``run``.
COMMANDS = {
    "explain": explain,
    "inspect": inspect,
    "profile": profile,
    "approx": approx,
    "bench": bench,
    "lens": lens_command,
    "draw": draw,
    "train": train,
    "ring": ring_command,
    "verify": verify_command,
}


def _build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="attnlab", description="Self-attention from scratch, step by step.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status. Under ``--lang zh`` the help and the error
    messages are in Chinese."""
    zh = wants_chinese(sys.argv[1:] if argv is None else argv)

    def fail(message: str) -> None:
        line = message.replace("\n", " ")
        print(localize_error(line) if zh else f"error: {line}", file=sys.stderr)

    try:
        parser = _build_parser()
        if zh:
            localize_parser(parser)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return int(COMMANDS[args.command].run(args))
    except (CliError, AttnlabError) as exc:
        fail(str(exc))
        return EXIT_USAGE
    except ImportError as exc:
        fail(str(exc))
        return EXIT_USAGE
    except OSError as exc:
        fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        return EXIT_USAGE
    except MemoryError as exc:  # an allocation far beyond this machine: say which, in one line
        detail = str(exc) or "an array did not fit in memory"
        fail(f"not enough memory: {detail}; use smaller sizes")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback: say what broke, in one line
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
