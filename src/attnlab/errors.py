"""attnlab's exceptions: one base class for bad input, one for a missing extra.

Every public function validates its inputs before any math (the checks are in
:mod:`attnlab.checks`), so that a mistake is reported as "which argument, what was
expected, what was received" instead of surfacing later as a NumPy broadcasting
error, a NaN or silently wrong numbers.
"""

from __future__ import annotations

from typing import Any

from .messages import Message, msg

__all__ = ["AttnlabError", "MissingExtraError", "ShapeError", "missing_extra"]


class AttnlabError(ValueError):
    """Base class of every error attnlab raises on bad input.

    It is a ``ValueError`` so that code which already catches ``ValueError``
    keeps working. Its message is one line: a received value whose repr spans
    several (an array, a tensor) is joined onto it.

    Raise it with a keyed message, ``AttnlabError(msg("check.flag", name=..., got=...))``
    (see :mod:`attnlab.messages`): ``str(error)`` is the English and ``error.message``
    the :class:`~attnlab.messages.Message`, which the command line renders in the
    language of ``--lang``. A plain string is still accepted (``message`` is then None).
    """

    message: Message | None

    def __init__(self, *args: Any) -> None:
        self.message = None
        if args and isinstance(args[0], Message):
            self.message = args[0]
            args = (args[0].render("en"), *args[1:])
        if args and isinstance(args[0], str) and "\n" in args[0]:
            args = (" ".join(line.strip() for line in args[0].splitlines()), *args[1:])
        super().__init__(*args)


class ShapeError(AttnlabError):
    """An array has the wrong number of dimensions or the wrong size."""


class MissingExtraError(ImportError):
    """An optional dependency is not installed; ``message`` says which extra to install."""

    def __init__(self, message: Message) -> None:
        super().__init__(message.render("en"))
        self.message = message


def missing_extra(module: str, extra: str, feature: str) -> ImportError:
    """The error raised when an optional dependency is not installed."""
    return MissingExtraError(msg("check.missing_extra", feature=feature, module=module,
                                 extra=extra))
