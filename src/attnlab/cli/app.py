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
from ..messages import Message, msg, render_error
from . import approx, bench, draw, explain, inspect, profile, train
from . import lens as lens_command
from . import ring as ring_command
from . import verify as verify_command
from .args import CliError, Parser
from .help_zh import localize_parser, wants_chinese

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
    parser.add_argument("--lang", choices=["en", "zh"], default=None, dest="top_lang",
                        help="language of the help, the errors and the command's output")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in COMMANDS.values():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status. Under ``--lang zh`` the help and the error
    messages are in Chinese."""
    zh = wants_chinese(sys.argv[1:] if argv is None else argv)

    lang = "zh" if zh else "en"

    def fail(error: BaseException | Message) -> None:
        text = error.render(lang) if isinstance(error, Message) else render_error(error, lang)
        line = text.replace("\n", " ")
        print(msg("phrase.error", text=line).render(lang), file=sys.stderr)

    try:
        parser = _build_parser()
        if zh:
            localize_parser(parser)
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        if args.top_lang is not None and getattr(args, "lang", args.top_lang) != args.top_lang:
            args.lang = args.top_lang  # `attnlab --lang zh explain`: the command in Chinese too
        return int(COMMANDS[args.command].run(args))
    except (CliError, AttnlabError) as exc:
        fail(exc)
        return EXIT_USAGE
    except ImportError as exc:
        fail(exc)
        return EXIT_USAGE
    except OSError as exc:
        detail = f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
        fail(msg("cli.os_error", detail=detail))
        return EXIT_USAGE
    except MemoryError as exc:  # an allocation far beyond this machine: say which, in one line
        fail(msg("cli.no_memory", detail=str(exc) or "an array did not fit in memory"))
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback: say what broke, in one line
        print(msg("cli.internal", type=type(exc).__name__, detail=exc).render(lang),
              file=sys.stderr)
        return EXIT_INTERNAL
