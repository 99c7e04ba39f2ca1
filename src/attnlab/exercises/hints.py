"""The checker's messages: keys of :data:`attnlab.messages.MESSAGES` (``exercise.*``).

A verdict is a key plus parameters (``{case}``, ``{expected}``...), rendered in the
learner's language. The Chinese uses d2l's terms (注意力汇聚, 掩蔽, 层规范化).
"""

from __future__ import annotations

from typing import Any

from ..errors import AttnlabError
from ..messages import MESSAGES, Message, msg

__all__ = ["LANGS", "case_label", "hint", "render"]

LANGS = ("zh", "en")


def _check_lang(lang: Any) -> None:
    if lang not in LANGS:
        raise AttnlabError(f"lang: expected 'zh' or 'en', got {lang!r}")


def hint(key: str, **params: Any) -> Message:
    """The keyed message of verdict ``key`` (a case given by its key is named too)."""
    if "case" in params:
        params["case"] = msg(f"exercise.case.{params['case']}")
    return msg(f"exercise.{key}", **params)


def case_label(key: str, lang: str) -> str:
    """The name of the input case ``key`` in ``lang``."""
    _check_lang(lang)
    return msg(f"exercise.case.{key}").render(lang)


def render(key: str, lang: str, **params: Any) -> str:
    """The verdict ``key`` in ``lang``, with its parameters filled in."""
    _check_lang(lang)
    return hint(key, **params).render(lang)


def known(key: str) -> bool:
    """Whether ``key`` names a verdict of the catalog."""
    return f"exercise.{key}" in MESSAGES
