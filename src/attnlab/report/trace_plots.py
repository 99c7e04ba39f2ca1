"""A trace drawn step by step: per head, the scores, the scaled scores and the weights
side by side, blocked cells greyed and hatched, numbers on every cell that fits.

Dimension legend: H heads, T query length, S key length. matplotlib is imported
inside the functions (through :mod:`attnlab.report.heatmaps`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..trace import Trace
from .figures import new_figure
from .fonts import font_context
from .heatmaps import declutter_ticks, plot_attention, plot_head_grid
from .text import step_title, trace_tokens
from .words import Lang

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_STEP_HEADS", "plot_trace"]

#: Past this many heads (or 16 tokens) a trace is drawn as a grid of weights only: three
#: panels per head would be too small to read.
MAX_STEP_HEADS = 4
_MAX_STEP_TOKENS = 16


def _allowed(trace: Trace, head: int | None) -> np.ndarray | None:
    """The (T, S) mask a head's "masked" step shows (-inf = blocked), or None."""
    for step in trace.steps:
        if step.key == "masked" and step.head == head:
            return np.isfinite(step.values)
    return None


def plot_trace(trace: Trace, *, lang: Lang = "en", title: str | None = None) -> Figure:
    """Scores, scaled scores and weights of each head, in one figure (rows = heads).

    A single head's weights panel has seed 000's title ("Attention weights" /
    "注意力权重热图") unless ``title`` is given. Scores are drawn on a colour scale
    centred on 0; weights on 0..1. Blocked cells (a mask, padding or causality) are
    greyed and hatched, never written as 0.00. Over 4 heads or 16 tokens: the weights
    of every head as one grid.
    """
    queries, keys = trace_tokens(trace, lang)
    weight_steps = [s for s in trace.steps if s.key == "weights"]
    heads = [s.head for s in weight_steps]
    if len(heads) > MAX_STEP_HEADS or len(queries) > _MAX_STEP_TOKENS:
        weights = np.stack([s.values for s in weight_steps])  # (H, T, S)
        allowed = _allowed(trace, heads[0])
        return plot_head_grid(weights, queries, keys, title=title, lang=lang, allowed=allowed)
    kinds = [k for k in ("scores", "scaled", "weights") if any(s.key == k for s in trace.steps)]
    T, S = weight_steps[0].values.shape
    panel_w, panel_h = max(3.2, 0.55 * S + 1.8), max(2.6, 0.45 * T + 1.4)
    fig = new_figure((panel_w * len(kinds), panel_h * len(heads) + (0.5 if title else 0.0)))
    grid = fig.add_gridspec(len(heads), len(kinds))
    for row, head in enumerate(heads):
        allowed = _allowed(trace, head)
        for col, kind in enumerate(kinds):
            step = trace.get(kind, head=head)
            ax = fig.add_subplot(grid[row, col])
            name = step_title(step, lang)
            if kind == "weights" and head is None and title is None:
                name = "注意力权重热图" if lang == "zh" else "Attention weights"
            if head is not None:
                name = (f"头 {head + 1} · " if lang == "zh" else f"Head {head + 1} · ") + name
            if kind == "weights":
                plot_attention(step.values, queries, keys, ax=ax, title=name, lang=lang,
                               allowed=allowed)
            else:
                # Blocked cells are hatched over, but the scale must hold them too.
                edge = float(np.max(np.abs(step.values))) or 1.0
                plot_attention(step.values, queries, keys, ax=ax, title=name, lang=lang,
                               allowed=allowed, cmap="RdBu_r", vmin=-edge, vmax=edge)
    if title is not None:
        with font_context() as families:
            fig.suptitle(title, fontfamily=families, parse_math=False)
    declutter_ticks(fig)
    return fig
