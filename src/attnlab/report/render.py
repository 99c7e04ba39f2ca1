"""A trace drawn, written to files, and shown in the viewer.

    plot(trace)            heatmap of its weights: one head -> one map, several -> a grid
    save(trace, "out/")    heatmap.png, heatmap.svg, trace.json, trace.md
    view(trace)            the interactive viewer (an AttentionView; in Jupyter it shows
                           itself, and ``.save("view.html")`` writes the page)

The trace itself is data (:class:`attnlab.trace.Trace`); every word and picture made
from it is made here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..checks import check_text, make_folder
from ..lens.diagnostics import Diagnostics
from ..trace import Trace
from .figures import save_figure
from .heatmaps import plot_attention, plot_head_grid
from .text import check_lang, to_json, to_markdown, trace_tokens
from .trace_plots import plot_trace
from .viewer import AttentionView
from .words import Lang

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot", "save", "view"]


def plot(trace: Trace, *, lang: Lang = "en", title: str | None = None) -> Figure:
    """The trace drawn: an ``explain`` trace (scores, and weights per head) as
    :func:`~attnlab.report.trace_plots.plot_trace` draws it, scores beside weights;
    a trace of weights only (a model's) as one heatmap, or a grid of its heads.

    A single head gets seed 000's title ("Attention weights" / "注意力权重热图") unless
    ``title`` is given.
    """
    check_lang(lang)
    if any(step.key == "scores" for step in trace.steps):
        return plot_trace(trace, lang=lang, title=title)
    weights = trace.weights()  # (H, T, S)
    queries, keys = trace_tokens(trace, lang)
    if len(weights) == 1:
        if title is None:  # seed 000's heatmap title
            title = "注意力权重热图" if lang == "zh" else "Attention weights"
        return plot_attention(weights[0], queries, keys, title=title, lang=lang)
    return plot_head_grid(weights, queries, keys, title=title, lang=lang)


def save(trace: Trace, out_dir: str | Path, *, lang: Lang = "en") -> list[Path]:
    """Write heatmap.png, heatmap.svg, trace.json and trace.md into ``out_dir``.

    Every token is checked before anything is written; returns the paths written.
    """
    check_lang(lang)
    for name, labels in (("tokens", trace.tokens), ("key_tokens", trace.key_tokens or [])):
        for i, token in enumerate(labels):
            check_text(str(token), f"{name}[{i}]")
    folder = make_folder(out_dir, "out_dir")
    written = [folder / "trace.json", folder / "trace.md"]
    written[0].write_text(to_json(trace) + "\n", encoding="utf-8")
    written[1].write_text(to_markdown(trace, lang), encoding="utf-8")
    figure = plot(trace, lang=lang)
    for name in ("heatmap.png", "heatmap.svg"):
        written.append(save_figure(figure, folder / name))
    return written


def view(
    trace: Trace,
    *,
    diagnostics: Diagnostics | None = None,
    title: str | None = None,
    lang: Lang = "en",
) -> AttentionView:
    """The interactive viewer of every ``weights`` step of ``trace`` (L, H, T, S).

    In Jupyter the returned :class:`AttentionView` displays itself; ``.save(path)``
    writes the self-contained page.
    """
    return AttentionView.from_trace(trace, diagnostics=diagnostics, title=title, lang=lang)
