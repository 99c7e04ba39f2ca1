"""Every word attnlab shows, in English and Chinese: step titles and notes, table
headings, diagnostic flags, the viewer's interface.

Data modules (the trace, the diagnostics) hold numbers and keys only; the words for
them live in the report layer that renders them, one file per thing shown:
:mod:`~attnlab.report.trace_words` (a trace's steps and notes),
:mod:`~attnlab.report.viewer_words` (the head diagnostics and the viewer),
:mod:`~attnlab.report.concept_words` (the concept pictures). This module gathers
them, with the two languages (:data:`Lang`, :data:`LANGS`).
"""

from __future__ import annotations

from typing import Literal

from .concept_words import CONCEPT_WORDS
from .trace_words import NOTE_TEXT, STEP_TEXT, TRACE_WORDS
from .viewer_words import (
    COLUMN_NOTES,
    FLAG_TEXT,
    HEAD_COLUMNS,
    LAYER_COLUMNS,
    LIST_SEP,
    VIEWER_WORDS,
)

__all__ = ["CONCEPT_WORDS", "Lang", "LANGS", "NOTE_TEXT", "STEP_TEXT", "TRACE_WORDS",
           "COLUMN_NOTES", "FLAG_TEXT", "HEAD_COLUMNS", "LAYER_COLUMNS", "LIST_SEP", "VIEWER_WORDS"]

Lang = Literal["en", "zh"]
LANGS = ("en", "zh")
