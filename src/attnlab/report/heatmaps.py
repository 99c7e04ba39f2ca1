"""Heatmaps of attention weights: one (T, S) matrix, or a grid of heads and layers.

Rows are queries and columns are keys, as in seed 000's seaborn heatmap
(``sns.heatmap(attention_weights, annot=True, cmap="YlGnBu")``), drawn here with
matplotlib alone. Dimension legend: L layers, H heads, T query length, S key length.

matplotlib is an optional dependency (``pip install 'attnlab[viz]'``); it is imported
inside the functions, so ``import attnlab`` never needs it. Figures are built with the
object-oriented API (:class:`matplotlib.figure.Figure` on an Agg canvas): nothing here
imports ``matplotlib.pyplot``, opens a window or touches pyplot's list of figures.

Chinese, Japanese and Korean text
---------------------------------
Every text attnlab draws uses the font fallback list ``["DejaVu Sans", <CJK font>]``,
so mixed labels such as ``"Query 小明"`` take Latin glyphs from DejaVu Sans and CJK
glyphs from the CJK font that :func:`find_cjk_font` located (Noto Sans CJK, Source Han
Sans, WenQuanYi, SimHei, ... or the file named by ``$ATTNLAB_CJK_FONT``).

If a title or label contains CJK characters and no CJK font exists, the plotting
functions emit a :class:`MissingCJKFontWarning` that says how to install one, and still
draw the figure (numbers, colours and the English part of the labels stay readable;
the CJK characters become empty boxes). They warn rather than raise so that a missing
font never stops a script or notebook; to make it fatal, use
``warnings.simplefilter("error", MissingCJKFontWarning)``.

Colour scale
------------
``vmin`` / ``vmax`` are the ends of the colour scale; ``None`` means "from the data"
(its minimum / maximum). A number is a promise about the data: values outside it
(beyond a 1e-6 tolerance for softmax rounding) raise an error instead of being clipped
silently. The defaults ``vmin=0.0, vmax=1.0`` fit attention weights; pass
``vmin=None, vmax=None`` to plot raw scores.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..checks import as_float_array, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from .figures import check_cmap, colour_limits, new_figure, save_figure
from .fonts import (
    CJK_FONT_ENV,
    MissingCJKFontWarning,
    find_cjk_font,
    font_context,
    require_matplotlib,
    warn_if_cjk_unrenderable,
)
from .heatmap_parts import (
    MAX_ANNOTATED_CELLS,
    MAX_GRID_ANNOTATED_CELLS,
    annotate_cells,
    axis_words,
    check_allowed,
    check_labels,
    check_lang,
    check_title,
    declutter_ticks,
    default_labels,
    hatch_blocked,
    root_figure,
    set_ticks,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

__all__ = [
    "CJK_FONT_ENV",
    "MissingCJKFontWarning",
    "declutter_ticks",
    "hatch_blocked",
    "find_cjk_font",
    "font_context",
    "plot_attention",
    "new_figure",
    "plot_head_grid",
    "save_figure",
]


def plot_attention(
    weights: npt.ArrayLike,
    query_labels: Sequence[Any] | None = None,
    key_labels: Sequence[Any] | None = None,
    *,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str | Colormap = "YlGnBu",
    ax: Axes | None = None,
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
    lang: str = "en",
    allowed: npt.ArrayLike | None = None,
) -> Figure:
    """Heatmap of one attention matrix: (T, S) -> Figure. Rows = queries, columns = keys.

    Args:
        weights: (T, S) finite values; row t is how query t spreads over the S keys.
        query_labels: T row labels; default ``word 1..T`` (``单词1..T`` when lang="zh").
        key_labels: S column labels; same default with S.
        title: figure title (Chinese is fine, see the module notes on fonts).
        annotate: write each value (2 decimals, black or white to read on its cell).
            None: only when T * S <= 100.
        cmap: colormap name or Colormap; seed 000 uses "YlGnBu".
        ax: draw into this Axes (a colour bar is added next to it) instead of a new figure.
        vmin, vmax: colour-scale ends; None = from the data. The defaults 0 and 1 suit
            attention weights, and values outside explicit limits raise (no silent
            clipping); use ``vmin=None, vmax=None`` for raw scores.
        lang: "en" (axis labels Key / Query) or "zh" (键 (Key) / 查询 (Query)).
        allowed: bool (T, S), True = may attend: blocked cells are drawn grey and
            hatched, without a number (a masked weight is not a small one).

    Returns:
        The Figure (``ax``'s figure when ``ax`` is given). Save it with :func:`save_figure`.
        Sequences longer than 40 get integer position ticks instead of labels.

    Raises:
        ShapeError: ``weights`` is not (T, S) with T, S >= 1.
        AttnlabError: non-finite or out-of-range values, label count != T or S, bad options.

    >>> w = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    >>> fig = plot_attention(w, ["小明", "去了", "学校"], lang="zh", title="注意力权重热图")
    >>> len(fig.axes)  # the heatmap and its colour bar
    2
    """
    require_matplotlib()
    from matplotlib.axes import Axes as AxesClass

    values = as_float_array(weights, "weights")
    if values.ndim != 2 or 0 in values.shape:
        raise ShapeError(f"weights: expected (T, S) with T, S >= 1, got {shape_str(values.shape)}")
    T, S = values.shape
    lang = check_lang(lang)
    title = check_title(title)
    rows = check_labels(query_labels, "query_labels", T, "T", default_labels(T, lang))
    cols = check_labels(key_labels, "key_labels", S, "S", default_labels(S, lang))
    if annotate is not None and not isinstance(annotate, (bool, np.bool_)):
        raise AttnlabError(f"annotate: expected True, False or None (auto), got {annotate!r}")
    if ax is not None and not isinstance(ax, AxesClass):
        raise AttnlabError(f"ax: expected a matplotlib Axes or None, got {type(ax).__name__}")
    colormap = check_cmap(cmap)
    blocked = check_allowed(allowed, (T, S))
    low, high = colour_limits(values, vmin, vmax)
    show_values = T * S <= MAX_ANNOTATED_CELLS if annotate is None else bool(annotate)
    x_word, y_word = axis_words(lang)

    with font_context() as families:
        warn_if_cjk_unrenderable(
            [*rows, *cols, x_word, y_word, title or ""], families, "plot_attention"
        )
        own_figure = ax is None
        if ax is None:
            fig = new_figure(
                (min(14.0, max(5.5, 0.55 * S + 3.0)), min(12.0, max(4.5, 0.5 * T + 2.0)))
            )
            ax = fig.add_subplot()
        else:
            fig = root_figure(ax)
        image = ax.imshow(
            values, cmap=colormap, vmin=low, vmax=high, aspect="auto", interpolation="nearest"
        )
        set_ticks(ax, cols, "x", families, 10)
        set_ticks(ax, rows, "y", families, 10)
        ax.set_xlabel(x_word, fontfamily=families)
        ax.set_ylabel(y_word, fontfamily=families)
        if title is not None:
            ax.set_title(title, fontfamily=families, parse_math=False)
        if show_values:
            annotate_cells(ax, values, colormap, low, high, families, blocked)
        else:
            hatch_blocked(ax, blocked)
        fig.colorbar(image, ax=ax)
        if own_figure:  # into a given Axes: the caller lays out (and declutters) its figure
            declutter_ticks(fig)
    return fig


def plot_head_grid(
    weights: npt.ArrayLike,
    query_labels: Sequence[Any] | None = None,
    key_labels: Sequence[Any] | None = None,
    *,
    titles: Sequence[str] | None = None,
    ncols: int | None = None,
    title: str | None = None,
    lang: str = "en",
    annotate: bool | None = None,
    allowed: npt.ArrayLike | None = None,
) -> Figure:
    """One heatmap per head: (H, T, S) or (L, H, T, S) -> Figure with one shared colour bar.

    Args:
        weights: attention weights in [0, 1]. (H, T, S): heads in a grid of ``ncols``
            columns (default: about 4 per row, balanced). (L, H, T, S): one row per
            layer, one column per head.
        query_labels, key_labels: T and S labels shared by every panel (defaults as in
            :func:`plot_attention`); shown on the outer panels, and only when the
            sequence has at most 40 positions (integer ticks otherwise).
        titles: one per panel, row-major (H titles, or L * H for 4-D weights);
            default "Head h" / "头 h", or "Layer l · Head h" / "层 l · 头 h".
        ncols: panels per row, only for (H, T, S).
        title: figure title above all panels.
        lang: "en" or "zh".
        annotate: write each weight on its cell; None: when T * S <= 64.
        allowed: bool (T, S) shared by the panels: blocked cells greyed and hatched.

    All panels share the colour scale 0..1, so colours compare across heads.

    >>> fig = plot_head_grid(np.full((2, 4, 5, 5), 0.2))
    >>> len([a for a in fig.axes if a.get_label() != "<colorbar>"])
    8
    """
    require_matplotlib()
    values = as_float_array(weights, "weights")
    if values.ndim not in (3, 4) or 0 in values.shape:
        raise ShapeError(
            "weights: expected (H, T, S) or (L, H, T, S) with every size >= 1, "
            f"got {shape_str(values.shape)}"
        )
    lang = check_lang(lang)
    title = check_title(title)
    T, S = values.shape[-2:]
    panels = values.reshape(-1, T, S)  # (L * H, T, S), row-major: layer, then head
    count = panels.shape[0]
    if values.ndim == 4:
        L, H = values.shape[:2]
        if ncols is not None:
            raise AttnlabError(
                "ncols: only for (H, T, S) weights; (L, H, T, S) is laid out as L rows by "
                f"H columns, got ncols={ncols!r} with weights {shape_str(values.shape)}"
            )
        nrows, ncols = L, H
        default_titles = [
            f"层 {layer} · 头 {head}" if lang == "zh" else f"Layer {layer} · Head {head}"
            for layer in range(1, L + 1)
            for head in range(1, H + 1)
        ]
    else:
        if ncols is None:
            nrows = math.ceil(count / 4)
            ncols = math.ceil(count / nrows)
        else:
            ncols = min(check_positive_int(ncols, "ncols"), count)
            nrows = math.ceil(count / ncols)
        default_titles = [
            f"头 {head}" if lang == "zh" else f"Head {head}" for head in range(1, count + 1)
        ]
    if titles is None:
        panel_titles = default_titles
    else:
        expected = "H" if values.ndim == 3 else "L * H"
        panel_titles = check_labels(titles, "titles", count, expected, default_titles)
    rows = check_labels(query_labels, "query_labels", T, "T", default_labels(T, lang))
    cols = check_labels(key_labels, "key_labels", S, "S", default_labels(S, lang))
    low, high = colour_limits(values, 0.0, 1.0)
    colormap = check_cmap("YlGnBu")
    x_word, y_word = axis_words(lang)
    blocked = check_allowed(allowed, (T, S))
    if annotate is not None and not isinstance(annotate, (bool, np.bool_)):
        raise AttnlabError(f"annotate: expected True, False or None (auto), got {annotate!r}")
    show_values = T * S <= MAX_GRID_ANNOTATED_CELLS if annotate is None else bool(annotate)

    panel_size = max(1.4, min(3.0, 16.0 / ncols))
    figsize = (ncols * panel_size + 1.2, nrows * panel_size + (0.9 if title else 0.4))
    with font_context() as families:
        warn_if_cjk_unrenderable(
            [*rows, *cols, *panel_titles, x_word, y_word, title or ""],
            families,
            "plot_head_grid",
        )
        fig = new_figure(figsize)
        grid = fig.add_gridspec(nrows, ncols)
        axes, images = [], []
        for index in range(count):
            row, col = divmod(index, ncols)
            ax = fig.add_subplot(grid[row, col])
            image = ax.imshow(
                panels[index],
                cmap=colormap,
                vmin=low,
                vmax=high,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_title(panel_titles[index], fontfamily=families, fontsize=9, parse_math=False)
            if show_values:
                annotate_cells(ax, panels[index], colormap, low, high, families, blocked,
                                fontsize=7 if max(T, S) <= 6 else 6)
            else:
                hatch_blocked(ax, blocked)
            set_ticks(ax, cols, "x", families, 7)
            set_ticks(ax, rows, "y", families, 7)
            # Tick labels and axis names only on the outer panels: the bottom panel of
            # each column (even when the last row is short) and the first column.
            bottom = index + ncols >= count
            left = col == 0
            ax.tick_params(labelbottom=bottom, labelleft=left)
            if bottom:
                ax.set_xlabel(x_word, fontfamily=families, fontsize=8)
            if left:
                ax.set_ylabel(y_word, fontfamily=families, fontsize=8)
            axes.append(ax)
            images.append(image)
        if title is not None:
            fig.suptitle(title, fontfamily=families, parse_math=False)
        fig.colorbar(images[0], ax=axes, shrink=0.9)  # one norm: any image will do
        declutter_ticks(fig)
    return fig
