"""A griffe extension for the API reference: attnlab's docstrings are plain text, not
Markdown, so three of their habits are turned into code blocks before mkdocstrings
renders them (the docstrings themselves stay as they are, for ``help()`` and doctest):

- doctest runs (``>>>`` lines and their output) become ``pycon`` blocks, so an index
  such as ``trace[:6]`` is never read as a Markdown link;
- a paragraph ending in ``::`` (reStructuredText's literal block: formulas, shape
  tables) keeps one colon, and the indented block after it becomes a ``text`` block;
- a ``Shapes:`` or ``Options:`` heading with an indented block becomes a bold heading
  over a ``text`` block (the shape legend keeps its columns).

Google-style sections (``Args:``, ``Returns:``, ...) are left to mkdocstrings' parser.
"""

from __future__ import annotations

import textwrap

import griffe

BLOCK_HEADINGS = ("Shapes:", "Options:")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _indented_block(lines: list[str], start: int, base: int) -> int:
    """Index after the block of lines indented deeper than ``base`` from ``start``
    (blank lines inside it included, trailing blank lines not)."""
    end = start
    i = start
    while i < len(lines):
        if lines[i].strip() == "":
            i += 1
            continue
        if _indent(lines[i]) <= base:
            break
        i += 1
        end = i
    return end


def _fence(body: list[str], lang: str, indent: str) -> list[str]:
    text = textwrap.dedent("\n".join(body)).strip("\n")
    return [f"{indent}```{lang}", *(indent + line if line else "" for line in text.split("\n")),
            f"{indent}```"]


def to_markdown(doc: str) -> str:
    """The docstring ``doc`` (already dedented) with its plain-text code turned into
    fenced blocks."""
    lines = doc.split("\n")
    out: list[str] = []
    i = 0
    in_fence = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = line[: _indent(line)]
        if stripped.startswith("```"):
            in_fence = not in_fence
            out.append(line)
            i += 1
            continue
        if in_fence:
            out.append(line)
            i += 1
            continue
        if stripped.startswith(">>>"):
            run = []
            while i < len(lines) and lines[i].strip():
                run.append(lines[i])
                i += 1
            out.extend(["", *_fence(run, "pycon", indent), ""])
            continue
        if stripped in BLOCK_HEADINGS:
            end = _indented_block(lines, i + 1, _indent(line))
            if end > i + 1:
                out.extend([f"{indent}**{stripped[:-1]}**", "",
                            *_fence(lines[i + 1:end], "text", indent), ""])
                i = end
                continue
        if stripped.endswith("::") and not stripped.startswith((">>>", "...")):
            end = _indented_block(lines, i + 1, _indent(line))
            if end > i + 1:
                head = line.rstrip()[:-1]
                if head.strip() == ":":
                    head = ""
                out.extend([head, "", *_fence(lines[i + 1:end], "text", indent), ""])
                i = end
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class PlainTextDocstrings(griffe.Extension):
    """Fence the doctest runs, literal blocks and shape tables of every docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
