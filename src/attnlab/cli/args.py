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


class CliError(Exception):
    """A user-facing error of the command line (printed in one line)."""


class Parser(argparse.ArgumentParser):
    usage_prefix = "usage: "  # cli.help_zh sets it to 用法： under --lang zh

    def error(self, message: str) -> Any:  # argparse's own errors: one line, exit 2
        raise CliError(f"{self.prog}: {message}")

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
        raise CliError(f"{option}: expected comma-separated integers like {example}, "
                       f"got {text!r}") from None
    if not values or min(values) < 1:
        raise CliError(f"{option}: expected positive integers like {example}, got {text!r}")
    return values


def parse_matrix(text: str) -> np.ndarray:
    """``--x``: a .npy or .csv file, or an inline matrix: "1,0,1,0; 0,2,0,2" or JSON."""
    path = Path(text)
    if text.endswith(".npy"):
        if not path.is_file():
            raise CliError(f"--x: file not found: {text}")
        try:
            with path.open("rb") as f:
                if f.read(6) != b"\x93NUMPY":  # np.load would try it as a pickle
                    raise CliError(f"--x: {text} is not a .npy file (no NumPy header)")
            return np.asarray(np.load(path, allow_pickle=False))
        except (ValueError, OSError, EOFError) as exc:
            raise CliError(f"--x: could not read {text} as a .npy array ({exc})") from None
    if text.endswith((".csv", ".txt")):
        if not path.is_file():
            raise CliError(f"--x: file not found: {text}")
        try:
            with warnings.catch_warnings():  # "input contained no data": reported below
                warnings.simplefilter("ignore", UserWarning)
                matrix = np.atleast_2d(np.loadtxt(path, delimiter=",", ndmin=2))
        except (ValueError, OSError) as exc:
            raise CliError(f"--x: could not read {text} as a numeric CSV ({exc})") from None
        if matrix.size == 0:
            raise CliError(f"--x: {text} holds no numbers")
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
        raise CliError(
            f"--x: expected a matrix like '1,0,1,0; 0,2,0,2' or '[[1,0],[0,1]]' "
            f"or a .npy/.csv file, got {text!r}"
        ) from None
    if matrix.ndim != 2:
        raise CliError(f"--x: expected a 2-D matrix (rows = tokens), got shape {matrix.shape}")
    return matrix


def _inline_row(row: str, number: int, text: str) -> list[float]:
    """One row of an inline --x: numbers separated by commas or spaces; an empty
    field ("1,,2") or an empty row ("1,2;;3,4") is an error, never skipped."""
    fields = row.split(",") if "," in row else row.split()
    if not fields or any(not field.strip() for field in fields):
        raise CliError(f"--x: row {number} of {text!r} has an empty "
                       f"{'row' if not row.strip() else 'field'} ({row.strip()!r}); "
                       "expected numbers separated by commas, rows by ';'")
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
        raise CliError(f"{flag}: expected a folder, got an empty string")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise CliError(f"{flag}: expected a folder, got {text}, which is a file")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"{flag}: could not create the folder {text} "
                       f"({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CliError(f"{flag}: the folder {text} is not writable")
    return path


def check_memory(nbytes: float, flag: str, what: str) -> None:
    """Refuse a run that needs more than this machine's physical memory, naming ``flag``.

    Better than the alternative: the kernel's out-of-memory killer ending the
    process with no message at all.
    """
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not available on this platform
        return
    if total > 0 and nbytes > total:
        raise CliError(f"{flag}: {what} needs about {nbytes / 2**30:,.1f} GiB, more than this "
                       f"machine's {total / 2**30:,.1f} GiB of memory; use smaller sizes")
