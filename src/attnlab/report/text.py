"""Traces and diagnostics as text: plain text for a terminal, Markdown, titled JSON.

Every renderer takes the data object and ``lang`` ("en" or "zh"); the words come
from :mod:`attnlab.report.words`. A CJK character takes two terminal columns, and
the tables are aligned accordingly.

>>> from attnlab.lens.explain import explain
>>> trace = explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True)
>>> print(to_text(trace, "zh").splitlines()[1])
词元：小明 | 去了 | 学校
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..lens.diagnostics import Diagnostics
from ..trace import Step, Trace
from .words import (
    COLUMN_NOTES,
    FLAG_TEXT,
    HEAD_COLUMNS,
    LANGS,
    LAYER_COLUMNS,
    LIST_SEP,
    NOTE_TEXT,
    STEP_TEXT,
    TRACE_WORDS,
    Lang,
)

__all__ = ["MAX_PRECISION", "check_lang", "check_precision", "diagnostics_table",
           "display_width", "note_lines", "shown_flags", "step_note", "step_title", "to_json",
           "to_markdown", "to_text", "trace_dict", "trace_tokens"]

#: Decimals printed at most: float64 holds about 17 significant digits.
MAX_PRECISION = 17

#: Which axes of a step's matrix are indexed by tokens: (rows, columns).
_TOKEN_AXES = {
    "X": ("q", None), "Q": ("q", None), "K": ("k", None), "V": ("k", None),
    "scores": ("q", "k"), "scaled": ("q", "k"), "masked": ("q", "k"),
    "weights": ("q", "k"), "output": ("q", None), "concat": ("q", None),
    "projected": ("q", None), "pe": ("q", None), "embedded": ("q", None),
    "normed_in": ("q", None), "Q_all": ("q", None), "K_all": ("k", None), "V_all": ("k", None),
    "Q_rope": ("q", None), "K_rope": ("k", None), "residual": ("q", None), "normed": ("q", None),
}


def check_lang(lang: Any) -> Lang:
    """``lang`` if it is "en" or "zh", else an AttnlabError naming it."""
    if lang not in LANGS:
        raise AttnlabError(f"lang: expected 'en' or 'zh', got {lang!r}")
    return "zh" if lang == "zh" else "en"


def check_precision(precision: Any) -> int:
    """A number of decimals in 0..MAX_PRECISION (a NumPy integer is fine, a bool is not)."""
    if isinstance(precision, (bool, np.bool_)) or not isinstance(precision, (int, np.integer)) \
            or not 0 <= precision <= MAX_PRECISION:
        raise AttnlabError(
            f"precision: expected an integer number of decimals in 0..{MAX_PRECISION}, "
            f"got {precision!r}"
        )
    return int(precision)


def display_width(text: str) -> int:
    """Columns ``text`` takes in a terminal: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def step_title(step: Step, lang: Lang = "en") -> str:
    """The step's title ("Attention weights" / "注意力权重"); its key if it has none."""
    return STEP_TEXT.get(step.key, {}).get(lang, (step.key, ""))[0]


def step_note(step: Step, lang: Lang = "en") -> str:
    """One line on what the step computes and why ("" for an unknown key)."""
    return STEP_TEXT.get(step.key, {}).get(lang, ("", ""))[1]


# ------------------------------------------------------------------------ traces


def trace_dict(trace: Trace) -> dict[str, Any]:
    """:meth:`Trace.to_dict` with each step's title in both languages, after its key."""
    data = trace.to_dict()
    data["steps"] = [
        {"key": step["key"], "title": {"en": step_title(s, "en"), "zh": step_title(s, "zh")},
         **{k: v for k, v in step.items() if k != "key"}}
        for s, step in zip(trace.steps, data["steps"], strict=True)
    ]
    return data


def to_json(trace: Trace, indent: int | None = 2) -> str:
    """The trace as JSON with step titles (what ``attnlab explain --format json`` prints
    and ``save`` writes to trace.json); -inf values are written as null."""
    return json.dumps(trace_dict(trace), ensure_ascii=False, indent=indent)


def to_text(trace: Trace, lang: Lang = "en", *, precision: int = 4) -> str:
    """Every step with its title, formula, shape and values, as plain text.

    It ends with a summary: for each attention-weights step, the key each query
    token gives its largest weight.
    """
    check_lang(lang)
    precision = check_precision(precision)
    words = TRACE_WORDS[lang]
    lines = [f"== {words['trace']} ==",
             f"{words['tokens']}{words['colon']}" + " | ".join(trace_tokens(trace, lang)[0])]
    for number, step in enumerate(trace.steps, 1):
        lines.append("")
        lines.append(_heading(step, number, lang) + f"    {words['shape']} {step.shape}")
        lines.append(f"  {step.formula}    # {step_note(step, lang)}")
        row_labels, col_labels = _axis_labels(trace, step, lang)
        sums = step.values.sum(axis=-1) if step.key == "weights" else None
        lines.extend("  " + row for row in _format_matrix(
            step.values, row_labels, col_labels, precision, sums, words["row_sums"]))
    summary = _summary(trace, lang, precision)
    if summary:
        lines += ["", f"== {words['summary']} ==",
                  "  " + words["summary_note"] + words["colon"].rstrip()]
        lines += ["  " + (f"{where}{words['colon']}" if where else "") + "   ".join(pairs)
                  for where, pairs in summary]
    notes = note_lines(trace, lang)
    if notes:
        lines += ["", f"== {words['notes']} =="] + [f"  * {note}" for note in notes]
    return "\n".join(lines)


def to_markdown(trace: Trace, lang: Lang = "en", *, precision: int = 4) -> str:
    """The trace as a Markdown document: one section and one table per step, then the
    same summary as :func:`to_text`."""
    check_lang(lang)
    precision = check_precision(precision)
    words = TRACE_WORDS[lang]
    out = [f"# {words['trace']}", "", f"**{words['tokens']}**{words['colon']}" + " · ".join(
        _md_escape(t) for t in trace_tokens(trace, lang)[0])]
    for number, step in enumerate(trace.steps, 1):
        out += ["", f"## {_heading(step, number, lang)}", "",
                f"`{step.formula}` — {step_note(step, lang)} · {words['shape']} {step.shape}",
                ""]
        matrix = np.atleast_2d(step.values)
        row_labels, col_labels = _axis_labels(trace, step, lang)
        cols = col_labels or [str(j) for j in range(matrix.shape[1])]
        rows = row_labels or [str(i) for i in range(matrix.shape[0])]
        header = ["", *cols] + ([words["row_sums"]] if step.key == "weights" else [])
        out.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
        out.append("|" + "---|" * len(header))
        for i, row in enumerate(matrix):
            cells = [_md_escape(rows[i]), *(_fmt(x, precision) for x in row)]
            if step.key == "weights":
                cells.append(_fmt(float(row.sum()), precision))
            out.append("| " + " | ".join(cells) + " |")
    summary = _summary(trace, lang, precision)
    if summary:
        out += ["", f"## {words['summary']}", "",
                words["summary_note"] + words["colon"].rstrip(), ""]
        out += ["- " + (f"{where}{words['colon']}" if where else "")
                + " · ".join(_md_escape(p) for p in pairs) for where, pairs in summary]
    notes = note_lines(trace, lang)
    if notes:
        out += ["", f"## {words['notes']}", ""] + [f"- {_md_escape(note)}" for note in notes]
    return "\n".join(out) + "\n"


def note_lines(trace: Trace, lang: Lang = "en") -> list[str]:
    """The trace's notes (``trace.meta["notes"]``, see :mod:`attnlab.lens.explain_notes`)
    as sentences in ``lang``; rows and heads are numbered from 1."""
    check_lang(lang)
    sep = LIST_SEP[lang]
    lines = []
    for note in trace.meta.get("notes", []):
        kind = note.get("kind", "")
        if note.get("causal") and f"{kind}_causal" in NOTE_TEXT:
            kind = f"{kind}_causal"
        template = NOTE_TEXT.get(kind, {}).get(lang)
        if template is None:
            continue
        head = note.get("head")
        where = "" if head is None else (
            f"Head {head + 1}: " if lang == "en" else f"第 {head + 1} 个头：")
        rows = [r + 1 for r in note.get("rows", [])]
        fields = {
            "where": where,
            "rows": sep.join(map(str, rows)),
            "positions": sep.join(map(str, rows)),
            "tokens": sep.join(note.get("tokens", [])),
            "spread": f"{note.get('spread', 0.0):.4g}",
            "max_score": f"{note.get('max_score', 0.0):.4g}",
            "entropy": f"{note.get('entropy', 0.0):.3f}",
        }
        text = template.format(**fields)
        if lang == "en" and where:  # "Head 1: the softmax" -> "Head 1: The softmax"
            text = where + text[len(where)].upper() + text[len(where) + 1:]
        elif lang == "en":
            text = text[0].upper() + text[1:]
        lines.append(text)
    return lines


def _summary(trace: Trace, lang: Lang, precision: int) -> list[tuple[str, list[str]]]:
    """Per weights step: (where, ["query → strongest key (weight)", ...])."""
    found = []
    for step in trace.steps:
        if step.key != "weights":
            continue
        matrix = np.atleast_2d(step.values)  # (T, S)
        rows, cols = _axis_labels(trace, step, lang)
        rows = rows or [f"#{i + 1}" for i in range(matrix.shape[0])]
        cols = cols or [f"#{j + 1}" for j in range(matrix.shape[1])]
        pairs = []
        for i, row in enumerate(matrix):
            top = float(row.max())
            if not top > 0:  # a fully blocked row attends to nothing
                pairs.append(f"{rows[i]} → –")
                continue
            best = "/".join(cols[j] for j in np.flatnonzero(row >= top - 1e-12))  # ties
            pairs.append(f"{rows[i]} → {best} ({_fmt(top, precision)})")
        found.append((_where(step, lang), pairs))
    return found


def trace_tokens(trace: Trace, lang: Lang = "en") -> tuple[list[str], list[str]]:
    """(query labels, key labels) of a trace in ``lang``: explain's default labels
    ("word1".., ``meta["default_tokens"]``) become seed 000's 单词1.. in Chinese."""
    queries, keys = list(trace.tokens), list(trace.key_tokens or trace.tokens)
    if trace.meta.get("default_tokens"):
        word = "单词" if lang == "zh" else "word"
        queries = [f"{word}{i + 1}" for i in range(len(queries))]
        keys = [f"{word}{i + 1}" for i in range(len(keys))]
    return queries, keys


def _axis_labels(trace: Trace, step: Step, lang: Lang
                 ) -> tuple[list[str] | None, list[str] | None]:
    axes = _TOKEN_AXES.get(step.key, (None, None))
    queries, keys = trace_tokens(trace, lang)
    by_axis = {"q": queries, "k": keys, None: None}
    rows, cols = by_axis[axes[0]], by_axis[axes[1]]
    values = np.atleast_2d(step.values)
    if rows is not None and len(rows) != values.shape[0]:
        rows = None
    if cols is not None and len(cols) != values.shape[1]:
        cols = None
    return rows, cols


def _where(step: Step, lang: Lang) -> str:
    """"layer 2, head 1" / "第 2 层，第 1 个头"; "" for a step without layer or head."""
    where = []
    if lang == "en":
        if step.layer is not None:
            where.append(f"layer {step.layer + 1}")
        if step.head is not None:
            where.append(f"head {step.head + 1}")
        return ", ".join(where)
    if step.layer is not None:
        where.append(f"第 {step.layer + 1} 层")
    if step.head is not None:
        where.append(f"第 {step.head + 1} 个头")
    return "，".join(where)


def _heading(step: Step, number: int, lang: Lang) -> str:
    where = _where(step, lang)
    if lang == "en":
        return f"Step {number} · {step_title(step, lang)}" + (f" [{where}]" if where else "")
    return f"第 {number} 步 · {step_title(step, lang)}" + (f"（{where}）" if where else "")


def _fmt(x: float, precision: int) -> str:
    if np.isneginf(x):
        return "-∞"
    return f"{x:.{precision}f}"


def _pad(text: str, width: int) -> str:
    return " " * (width - display_width(text)) + text


def _format_matrix(
    values: np.ndarray,
    row_labels: list[str] | None,
    col_labels: list[str] | None,
    precision: int,
    row_sums: np.ndarray | None,
    sums_label: str,
) -> list[str]:
    matrix = np.atleast_2d(values)
    cells = [[_fmt(float(x), precision) for x in row] for row in matrix]
    cols = col_labels or [""] * matrix.shape[1]
    col_w = max([display_width(c) for c in cols]
                + [display_width(c) for row in cells for c in row] + [1])
    rows = row_labels or [""] * matrix.shape[0]
    row_w = max(display_width(r) for r in rows)
    lines = []
    if col_labels:
        header = " " * row_w + "  " + " ".join(_pad(c, col_w) for c in cols)
        if row_sums is not None:  # over the sums column: past "]" and three spaces
            header += "    " + sums_label
        lines.append(header)
    for i, row in enumerate(cells):
        line = _pad(rows[i], row_w) + " [" + " ".join(_pad(c, col_w) for c in row) + "]"
        if row_sums is not None:
            line += f"   {float(np.atleast_1d(row_sums)[i]):.{precision}f}"
        lines.append(line)
    return lines


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# ------------------------------------------------------------------- diagnostics


_POSITIONAL = ("previous_token", "next_token", "self")


def shown_flags(flags: list[str]) -> list[str]:
    """The flags as a reader should see them: a one-hot head that attends to a fixed
    position (previous-token, next-token, self) is one-hot by design, and the
    over-sparse rule misfires on it; say that instead of "over-sparse". The text table
    and the viewer's badges both show these."""
    if "over_sparse" in flags and any(f in _POSITIONAL for f in flags):
        return ["over_sparse_positional" if f == "over_sparse" else f for f in flags]
    return flags


def diagnostics_table(diagnostics: Diagnostics, lang: Lang = "en", *, precision: int = 3) -> str:
    """Plain-text tables for a terminal: one row per head, then one per layer.

    Layers and heads are numbered from 1 here (0-based in ``Diagnostics.to_dict``).
    """
    check_lang(lang)
    rows = [[str(h.layer + 1), str(h.head + 1),
             *(_cell(x, precision) for x in (h.entropy, h.max_weight, h.special_share,
                                             h.previous_token, h.next_token, h.self_token)),
             LIST_SEP[lang].join(FLAG_TEXT[f][lang] for f in shown_flags(h.flags)) or "-"]
            for h in diagnostics.heads]
    out = _table(HEAD_COLUMNS[lang], rows, left={8})
    layer_rows = []
    for layer in diagnostics.layers:
        closest = "-" if layer.closest_pair is None else (
            f"{layer.closest_pair[0] + 1}~{layer.closest_pair[1] + 1} "
            f"({layer.closest_pair[2]:.{precision}f})")
        dupes = LIST_SEP[lang].join(
            f"{a + 1}~{b + 1}" for a, b, _ in layer.near_duplicates) or "-"
        layer_rows.append([str(layer.layer + 1), _cell(layer.mean_js_distance, precision),
                           closest, dupes])
    out += [""] + _table(LAYER_COLUMNS[lang], layer_rows, left={2, 3})
    out += [""] + [f"  {line}" for line in COLUMN_NOTES[lang]]
    return "\n".join(out)


def _cell(value: float | None, precision: int) -> str:
    return "-" if value is None else f"{value:.{precision}f}"


def _table(header: list[str], rows: list[list[str]], *, left: set[int]) -> list[str]:
    widths = [max(display_width(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        parts = []
        for i, cell in enumerate(cells):
            pad = " " * (widths[i] - display_width(cell))
            parts.append(cell + pad if i in left else pad + cell)
        return "  ".join(parts).rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
