"""Figures of the lenses: a layers × heads table of a measure (importance, ablation
drop), and a token-to-token rollout map. Tables are data from :mod:`attnlab.lens`
and :mod:`attnlab.studies.heads`; this module only draws them.

Layers and heads are labelled from 1, as in the printed tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import as_float_array, shape_str
from ..errors import ShapeError
from .fonts import font_context
from .heatmaps import plot_attention

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["plot_head_table", "plot_rollout"]


def plot_head_table(values: Any, *, title: str | None = None, lang: str = "en",
                    cmap: str = "magma_r") -> Figure:
    """Heatmap of an (L, H) table: rows = layers, columns = heads -> Figure."""
    table = as_float_array(values, "values")
    if table.ndim != 2 or 0 in table.shape:
        raise ShapeError(f"values: expected (L, H) with L, H >= 1, got {shape_str(table.shape)}")
    L, H = table.shape
    zh = lang == "zh"
    rows = [f"第{i + 1}层" if zh else f"L{i + 1}" for i in range(L)]
    cols = [f"头{h + 1}" if zh else f"H{h + 1}" for h in range(H)]
    fig = plot_attention(table, rows, cols, title=title, vmin=None, vmax=None, cmap=cmap,
                         annotate=False, lang=lang)
    _label(fig, "头 (head)" if zh else "head", "层 (layer)" if zh else "layer")
    return fig


def plot_rollout(matrix: Any, tokens: Sequence[str], *, title: str | None = None,
                 lang: str = "en") -> Figure:
    """Heatmap of a rollout or flow map (T, T): row i = output token, column j = input
    token -> Figure."""
    values = np.clip(as_float_array(matrix, "matrix"), 0.0, None)
    high = max(1.0, float(values.max())) if values.size else 1.0
    fig = plot_attention(values, list(tokens), list(tokens), title=title, vmin=0.0, vmax=high,
                         lang=lang)
    zh = lang == "zh"
    _label(fig, "输入词元 (input token)" if zh else "input token",
           "输出词元 (output token)" if zh else "output token")
    return fig


def _label(fig: Figure, x_label: str, y_label: str) -> None:
    """Name the heatmap's axes (in place of plot_attention's Key / Query)."""
    with font_context() as families:
        ax = fig.axes[0]
        ax.set_xlabel(x_label, fontfamily=families)
        ax.set_ylabel(y_label, fontfamily=families)
