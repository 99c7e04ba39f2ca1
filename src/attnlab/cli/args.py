"""Argument parsers and checks shared by the commands: integer lists, matrices, text, output
folders, memory.

Each raises :class:`CliError`, which :func:`attnlab.cli.main` prints as one line
(exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..messages import Message, msg

#: argparse's messages about the number of values, which it hands over as formatted
#: English only (argparse has no keys): their text -> our key.
_NARGS_KEYS = {"expected one argument": "argparse.one_argument"}


class CliError(Exception):
    """A user-facing error of the command line (printed in one line); takes a keyed
    :class:`~attnlab.messages.Message` as :class:`~attnlab.errors.AttnlabError` does
    (``message``; ``str()`` is the English). Not a ValueError: the parsers below
    catch ValueError from NumPy and must not catch their own errors."""

    message: Message | None

    def __init__(self, text: str | Message) -> None:
        self.message = text if isinstance(text, Message) else None
        super().__init__(text.render("en") if isinstance(text, Message) else text)


class Parser(argparse.ArgumentParser):
    """argparse with its own errors raised as keyed :class:`CliError` (one line, exit 2):
    a wrong choice, a value of the wrong type, an unknown argument, a missing one."""

    usage_prefix = "usage: "  # cli.help_zh sets it to 用法： under --lang zh

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("exit_on_error", False)  # ArgumentError reaches parse_known_args
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> Any:  # what argparse reports only by text
        prefix = "the following arguments are required: "
        if message.startswith(prefix):
            raise CliError(msg("argparse.required", args=message.removeprefix(prefix)))
        raise CliError(msg("argparse.other", detail=f"{self.prog}: {message}"))

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        try:
            return super().parse_known_args(args, namespace)
        except argparse.ArgumentError as err:
            key = _NARGS_KEYS.get(err.message)
            if key is not None:
                raise CliError(msg(key, arg=err.argument_name)) from None
            raise CliError(msg("argparse.other", detail=str(err))) from None

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            raise CliError(msg("argparse.unrecognized", args=" ".join(extras)))
        return parsed

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            raise CliError(msg("argparse.invalid_choice", arg=argparse._get_action_name(action),
                               got=repr(value),
                               choices=", ".join(map(repr, action.choices))))

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError:
            kind = getattr(action.type, "__name__", "")
            if kind in ("int", "float"):
                raise CliError(msg("argparse.invalid_value", arg=argparse._get_action_name(action),
                                   type=msg(f"phrase.{kind}"), got=repr(arg_string))
                               ) from None
            raise

    def format_usage(self) -> str:
        return super().format_usage().replace("usage: ", self.usage_prefix, 1)

    def format_help(self) -> str:
        return super().format_help().replace("usage: ", self.usage_prefix, 1)


def int_list(text: str, option: str, *, example: str = "256,1024") -> tuple[int, ...]:
    """``--lengths 256,1024``: positive integers separated by commas and/or spaces.

    Raises :class:`CliError` naming ``option`` for a non-integer, a value below 1 or
    an empty list, e.g. ``--lengths: expected positive integers like 256,1024, got '0'``.
    """
    try:
        values = tuple(int(item) for item in text.replace(",", " ").split())
    except ValueError:
        raise CliError(msg("cli.int_list", flag=option, example=example,
                           got=repr(text))) from None
    if not values or min(values) < 1:
        raise CliError(msg("cli.positive_ints", flag=option, example=example, got=repr(text)))
    return values


def parse_matrix(text: str) -> np.ndarray:
    """``--x``: a .npy or .csv file, or an inline matrix: "1,0,1,0; 0,2,0,2" or JSON."""
    path = Path(text)
    if text.endswith(".npy"):
        if not path.is_file():
            raise CliError(msg("cli.file_not_found", flag="--x", path=text))
        with path.open("rb") as f:
            if f.read(6) != b"\x93NUMPY":  # np.load would try it as a pickle
                raise CliError(msg("cli.not_npy", flag="--x", path=text))
        try:
            return np.asarray(np.load(path, allow_pickle=False))
        except (ValueError, OSError, EOFError) as exc:
            raise CliError(msg("cli.bad_npy", flag="--x", path=text, detail=exc)) from None
    if text.endswith((".csv", ".txt")):
        if not path.is_file():
            raise CliError(msg("cli.file_not_found", flag="--x", path=text))
        try:
            with warnings.catch_warnings():  # "input contained no data": reported below
                warnings.simplefilter("ignore", UserWarning)
                matrix = np.atleast_2d(np.loadtxt(path, delimiter=",", ndmin=2))
        except (ValueError, OSError) as exc:
            raise CliError(msg("cli.bad_csv", flag="--x", path=text, detail=exc)) from None
        if matrix.size == 0:
            raise CliError(msg("cli.empty_csv", flag="--x", path=text))
        return matrix
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            rows = json.loads(stripped)
            if not _numbers_only(rows):  # np.array would read true as 1.0 and "2" as 2.0
                raise ValueError("not a matrix of numbers")
        else:
            rows = [_inline_row(row, i + 1, text) for i, row in
                    enumerate(stripped.removesuffix(";").split(";"))]
        matrix = np.array(rows, dtype=np.float64)
    except (ValueError, TypeError):
        raise CliError(msg("cli.matrix", flag="--x", got=repr(text))) from None
    if matrix.ndim != 2:
        raise CliError(msg("cli.matrix_2d", flag="--x", shape=matrix.shape))
    return matrix


def _inline_row(row: str, number: int, text: str) -> list[float]:
    """One row of an inline --x: numbers separated by commas or spaces; an empty
    field ("1,,2") or an empty row ("1,2;;3,4") is an error, never skipped."""
    fields = row.split(",") if "," in row else row.split()
    if not fields or any(not field.strip() for field in fields):
        raise CliError(msg("cli.empty_row" if not row.strip() else "cli.empty_field", flag="--x",
                           number=number, text=repr(text), row=repr(row.strip())))
    return [float(field) for field in fields]


def _numbers_only(rows: Any) -> bool:
    """Whether parsed JSON is nested lists of numbers (no bools, strings or nulls)."""
    if isinstance(rows, list):
        return all(_numbers_only(row) for row in rows)
    return isinstance(rows, (int, float)) and not isinstance(rows, bool)


def text_argument(text: str, flag: str) -> str:
    """A free-text argument as valid Unicode, saying so on stderr if it was not.

    Python keeps argv bytes that are not UTF-8 as lone surrogates (``caf\\xe9``
    becomes ``'caf\\udce9'``), which no tokenizer, file or terminal accepts. They
    are replaced by U+FFFD (the replacement character), once, here.
    """
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that did not come from a byte
        raw = text.encode("utf-8", "surrogatepass")
    decoded = raw.decode("utf-8", "replace")
    if decoded != text:
        print(f"note: {flag}: the argument is not valid UTF-8; its undecodable bytes were "
              "replaced by \ufffd", file=sys.stderr)
    return decoded


def prepare_out_dir(text: str, flag: str = "--out") -> Path:
    """Create the output folder ``text`` now, before any long computation, or raise.

    A folder that cannot be made or written to (an empty name, a path through a
    regular file, an existing file, /proc, no permission) is reported naming
    ``flag`` at once, not after minutes of measuring.
    """
    if not text.strip():
        raise CliError(msg("cli.folder_empty", flag=flag))
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise CliError(msg("cli.folder_is_file", flag=flag, path=text))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(msg("cli.folder_failed", flag=flag, path=text,
                           detail=exc.strerror or exc)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(msg("cli.folder_readonly", flag=flag, path=text))
    return path


def check_memory(nbytes: float, flag: str, what: str | Message) -> None:
    """Refuse a run that needs more than this machine's physical memory, naming ``flag``.

    Better than the alternative: the kernel's out-of-memory killer ending the
    process with no message at all.
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not available on this platform
        return
    if total > 0 and nbytes > total:
        raise CliError(msg("cli.memory", flag=flag, what=what, need=f"{nbytes / 2**30:,.1f}",
                           total=f"{total / 2**30:,.1f}"))
