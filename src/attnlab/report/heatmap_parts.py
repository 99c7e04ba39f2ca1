"""The pieces the heatmaps are drawn with: argument checks (labels, language, titles, the
allowed mask), tick placement, cell annotations and the hatching of blocked cells.

:mod:`attnlab.report.heatmaps` (one matrix, a grid of heads) and the concept pictures
(:mod:`attnlab.report.concepts`) draw with them. matplotlib is imported by the caller;
these functions receive its objects. Dimension legend: T query length, S key length.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import check_text, describe, shape_str
from ..errors import AttnlabError
from .fonts import CJK_RE

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

__all__ = [
    "MAX_ANNOTATED_CELLS",
    "MAX_GRID_ANNOTATED_CELLS",
    "MAX_TICK_LABELS",
    "annotate_cells",
    "axis_words",
    "check_allowed",
    "check_labels",
    "check_lang",
    "check_title",
    "declutter_ticks",
    "default_labels",
    "hatch_blocked",
    "root_figure",
    "set_ticks",
]

MAX_TICK_LABELS = 40  # above this many positions, labels overlap: show indices instead
MAX_ANNOTATED_CELLS = 100
MAX_GRID_ANNOTATED_CELLS = 64  # a grid panel is smaller: 8 × 8 numbers still read
_LANGS = ("en", "zh")


# --------------------------------------------------------------------- validation


def check_labels(labels: Any, name: str, size: int, dim: str, default: list[str]) -> list[str]:
    if labels is None:
        return default
    if isinstance(labels, (str, bytes)):
        raise AttnlabError(
            f"{name}: expected a sequence of {size} labels ({dim}), got a single string "
            f"{labels!r}; wrap words in a list, e.g. [{labels!r}]"
        )
    try:
        items = [check_text(str(label), f"{name}[{i}]") for i, label in enumerate(labels)]
    except TypeError:
        raise AttnlabError(
            f"{name}: expected a sequence of {size} labels ({dim}), got {type(labels).__name__}"
        ) from None
    if len(items) != size:
        raise AttnlabError(f"{name}: expected {size} labels ({dim} = {size}), got {len(items)}")
    return items


def default_labels(size: int, lang: str) -> list[str]:
    if lang == "zh":
        return [f"单词{i}" for i in range(1, size + 1)]
    return [f"word {i}" for i in range(1, size + 1)]


def check_lang(lang: Any) -> str:
    if lang not in _LANGS:
        raise AttnlabError(f"lang: expected one of {', '.join(map(repr, _LANGS))}, got {lang!r}")
    return str(lang)


def check_title(title: Any, name: str = "title") -> str | None:
    if title is not None and not isinstance(title, str):
        raise AttnlabError(f"{name}: expected a str or None, got {type(title).__name__}")
    return None if title is None else check_text(title, name)


def axis_words(lang: str) -> tuple[str, str]:
    """(x label, y label): columns are keys, rows are queries."""
    return ("键 (Key)", "查询 (Query)") if lang == "zh" else ("Key", "Query")


def root_figure(ax: Axes) -> Figure:
    figure: Any = ax.figure  # a SubFigure's .figure is its root Figure; a Figure's is itself
    root: Figure = figure.figure
    return root


# ------------------------------------------------------------------------ drawing


def set_ticks(
    ax: Axes, labels: list[str], axis: str, families: list[str], fontsize: float
) -> None:
    """Label every position if it fits; otherwise leave matplotlib's integer ticks.

    Long Latin labels on x are turned 90°; CJK labels never are (a turned Chinese
    character reads sideways): :func:`declutter_ticks` thins them instead.
    """
    if len(labels) > MAX_TICK_LABELS:
        return
    positions = list(range(len(labels)))
    if axis == "x":
        cjk = any(CJK_RE.search(label) for label in labels)
        rotate = not cjk and (len(labels) > 6 or max(len(label) for label in labels) > 4)
        ax.set_xticks(
            positions,
            labels,
            fontfamily=families,
            fontsize=fontsize,
            rotation=90 if rotate else 0,
            ha="center",
            va="top",
            parse_math=False,  # labels are text: "$x$" is drawn as typed, "$$" is no error
        )
    else:
        ax.set_yticks(positions, labels, fontfamily=families, fontsize=fontsize,
                      parse_math=False)


def declutter_ticks(fig: Figure) -> None:
    """Hide tick labels that would overlap their neighbours, keeping every k-th.

    The figure is laid out once (no pixels drawn) to measure each label; on an axis
    whose neighbouring labels overlap, only every k-th stays visible, k the smallest
    step that leaves a gap. Colour bars are left alone.
    """
    get_renderer = getattr(fig.canvas, "get_renderer", None)
    if get_renderer is None:  # a figure on another backend's canvas: left as drawn
        return
    with warnings.catch_warnings():  # a glyph no font has: save_figure says it once
        warnings.filterwarnings("ignore", message="Glyph .* missing from font",
                                category=UserWarning)
        fig.draw_without_rendering()
    renderer = get_renderer()
    for ax in fig.axes:
        if ax.get_label() == "<colorbar>":
            continue
        for axis, ticks in (("x", ax.get_xticklabels()), ("y", ax.get_yticklabels())):
            shown = [t for t in ticks if t.get_visible() and t.get_text()]
            if len(shown) < 2:
                continue
            boxes = [t.get_window_extent(renderer) for t in shown]
            if axis == "x":  # upright or turned 90°, a label's box is its footprint
                size, gap = max(b.width for b in boxes), abs(boxes[1].x0 - boxes[0].x0)
            else:
                size, gap = max(b.height for b in boxes), abs(boxes[1].y0 - boxes[0].y0)
            if gap <= 0 or size * 1.1 <= gap:
                continue
            step = math.ceil(size * 1.1 / gap)
            for index, tick in enumerate(shown):
                if index % step:
                    tick.set_visible(False)


def annotate_cells(
    ax: Axes, values: np.ndarray, cmap: Colormap, low: float, high: float, families: list[str],
    allowed: np.ndarray | None = None, fontsize: float | None = None,
) -> None:
    """Write each value on its cell; a blocked cell (``allowed`` False) is greyed and
    hatched instead, with no number: its weight is 0 by the mask, not by the scores."""
    rgba = cmap(np.clip((values - low) / (high - low), 0.0, 1.0))  # (T, S, 4)
    luminance = rgba[..., :3] @ np.array([0.299, 0.587, 0.114])  # (T, S)
    T, S = values.shape
    if fontsize is None:
        fontsize = 10 if max(T, S) <= 6 else 8
    for row in range(T):
        for col in range(S):
            if allowed is not None and not allowed[row, col]:
                continue
            ax.text(
                col,
                row,
                f"{values[row, col]:.2f}",
                ha="center",
                va="center",
                fontsize=fontsize,
                fontfamily=families,
                color="black" if luminance[row, col] > 0.5 else "white",
            )
    hatch_blocked(ax, allowed)


def hatch_blocked(ax: Axes, allowed: np.ndarray | None) -> None:
    """Grey, hatched cells where ``allowed`` (T, S) is False (drawn over the image)."""
    from matplotlib.patches import Rectangle

    if allowed is None:
        return
    for row, col in zip(*np.nonzero(~allowed), strict=True):
        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, facecolor="#d9d9d9",
                               edgecolor="#7f7f7f", hatch="///", linewidth=0.0))


def check_allowed(allowed: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    if allowed is None:
        return None
    arr = np.asarray(allowed)
    if arr.dtype != np.bool_ or arr.shape != shape:
        raise AttnlabError(f"allowed: expected a bool array of shape {shape_str(shape)} "
                           f"(True = may attend), got {describe(allowed)}")
    return arr
