"""Rendering: traces as text (English and Chinese), heatmaps, fonts, and the offline viewer
(its HTML, CSS and JavaScript are package data files in ``assets/``).

Data (a :class:`~attnlab.trace.Trace`, a :class:`~attnlab.lens.diagnostics.Diagnostics`)
is made in the layers below; everything here turns it into words, pictures and pages::

    from attnlab import explain, report
    trace = explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True)
    print(report.to_text(trace, "zh"))     # or to_markdown(trace), to_json(trace)
    report.save(trace, "out/")             # heatmap.png, heatmap.svg, trace.json, trace.md
    report.view(trace)                     # the interactive viewer (shows itself in Jupyter)
    report.draw("flash", lang="zh")        # a concept: dataflow, flash, kvcache, positions, sparse
"""

from .concepts import draw, draw_all
from .dataflow import draw_dataflow
from .figures import new_figure, save_figure
from .heatmaps import plot_attention, plot_head_grid
from .render import plot, save, view
from .text import (
    diagnostics_table,
    note_lines,
    step_note,
    step_title,
    to_json,
    to_markdown,
    to_text,
)
from .viewer import AttentionView, render_html

__all__ = [
    "AttentionView",
    "diagnostics_table",
    "draw",
    "draw_all",
    "draw_dataflow",
    "new_figure",
    "note_lines",
    "plot",
    "plot_attention",
    "plot_head_grid",
    "render_html",
    "save",
    "save_figure",
    "step_note",
    "step_title",
    "to_json",
    "to_markdown",
    "to_text",
    "view",
]
