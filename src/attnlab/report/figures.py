"""matplotlib figures without pyplot: one factory, colour scales, and saving to PNG or SVG.

Every figure attnlab draws (heatmaps, benchmark and study plots) comes from
:func:`new_figure`: a :class:`matplotlib.figure.Figure` on an Agg canvas, so nothing
imports ``matplotlib.pyplot``, opens a window or touches pyplot's list of figures.
matplotlib is an optional dependency (``pip install 'attnlab[viz]'``), imported inside
the functions.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import make_folder
from ..errors import AttnlabError
from .fonts import font_context, require_matplotlib

if TYPE_CHECKING:
    from matplotlib.colors import Colormap
    from matplotlib.figure import Figure

__all__ = ["check_cmap", "colour_limits", "new_figure", "save_figure"]

_SUFFIXES = (".png", ".svg")
_LIMIT_TOL = 1e-6  # softmax rows may overshoot 1.0 by a few ulps


def new_figure(figsize: tuple[float, float] = (6.4, 4.2), *,
               feature: str = "Plotting") -> Figure:
    """An empty Figure of ``figsize`` inches, constrained layout, on its own Agg canvas.

    Without matplotlib: an ImportError naming ``feature`` and the ``viz`` extra.

    >>> new_figure((3.0, 2.0)).get_size_inches().tolist()
    [3.0, 2.0]
    """
    require_matplotlib(feature)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)  # Agg canvas without pyplot: no global figure manager
    return fig


def _check_limit(value: Any, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise AttnlabError(f"{name}: expected a number or None (auto), got {value!r}")
    if not math.isfinite(float(value)):
        raise AttnlabError(f"{name}: expected a finite number or None (auto), got {value!r}")
    return float(value)


def colour_limits(values: np.ndarray, vmin: Any, vmax: Any) -> tuple[float, float]:
    """The colour scale [low, high] of ``values``: ``vmin``/``vmax``, or the data's own
    ends where None. Explicit limits must contain the data (within 1e-6, for softmax
    rows that overshoot 1 by a few ulps): values outside raise instead of being clipped."""
    low_given, high_given = _check_limit(vmin, "vmin"), _check_limit(vmax, "vmax")
    if low_given is not None and high_given is not None and low_given >= high_given:
        raise AttnlabError(
            f"vmin, vmax: expected vmin < vmax, got vmin = {low_given:g}, vmax = {high_given:g}"
        )
    data_min, data_max = float(values.min()), float(values.max())
    below = low_given is not None and data_min < low_given - _LIMIT_TOL
    above = high_given is not None and data_max > high_given + _LIMIT_TOL
    if below or above:
        low_text = "-inf" if low_given is None else f"{low_given:g}"
        high_text = "inf" if high_given is None else f"{high_given:g}"
        raise AttnlabError(
            f"weights: expected values in [vmin, vmax] = [{low_text}, {high_text}], "
            f"got min {data_min:.4g} and max {data_max:.4g}. Attention weights lie in "
            "[0, 1]; to plot raw scores pass vmin=None, vmax=None (auto) or wider limits"
        )
    low = data_min if low_given is None else low_given
    high = data_max if high_given is None else high_given
    if low >= high:  # constant data on an automatic scale: centre it
        low, high = (low - 0.5, high + 0.5) if low_given is None else (low, low + 1.0)
    return low, high


def check_cmap(cmap: Any) -> Colormap:
    """A matplotlib colormap from its name or itself; anything else raises naming ``cmap``."""
    import matplotlib
    from matplotlib.colors import Colormap

    if isinstance(cmap, Colormap):
        return cmap
    if isinstance(cmap, str):
        try:
            return matplotlib.colormaps[cmap]
        except KeyError:
            pass
    raise AttnlabError(
        f"cmap: expected a matplotlib colormap name (e.g. 'YlGnBu', 'viridis') or "
        f"Colormap, got {cmap!r}"
    )


def save_figure(fig: Figure, path: str | os.PathLike[str], *, dpi: float = 150) -> Path:
    """Write ``fig`` to ``path`` (.png or .svg, chosen by suffix) and return the Path.

    Parent folders are created. SVG text is written as outlines
    (``svg.fonttype = "path"``), so CJK glyphs show on machines without the font.
    SVG output carries no date, so the same figure gives the same file.

    Example: ``save_figure(plot_attention(np.eye(3)), "out/attention.png")``.
    """
    require_matplotlib()
    from matplotlib.figure import Figure as FigureClass

    if not isinstance(fig, FigureClass):
        raise AttnlabError(f"fig: expected a matplotlib Figure, got {type(fig).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise AttnlabError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in _SUFFIXES:
        raise AttnlabError(
            f"path: expected a file name ending in {' or '.join(_SUFFIXES)}, "
            f"got {os.fspath(path)!r}"
        )
    if (
        isinstance(dpi, (bool, np.bool_))
        or not isinstance(dpi, (int, float, np.integer, np.floating))
        or not 0 < float(dpi) < math.inf
    ):
        raise AttnlabError(f"dpi: expected a positive number, got {dpi!r}")
    import matplotlib

    make_folder(target.parent, "path")
    metadata = {"Date": None} if suffix == ".svg" else None
    with font_context(), matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "attnlab"}):
        with warnings.catch_warnings():
            # A token no installed font has (an emoji, a control character) is drawn as a
            # box; matplotlib would also print two lines of warning per glyph and figure.
            warnings.filterwarnings("ignore", message="Glyph .* missing from font",
                                    category=UserWarning)
            try:
                fig.savefig(target, format=suffix[1:], dpi=float(dpi), metadata=metadata)
            except OSError as exc:  # the name is a folder, no permission, disk full
                raise AttnlabError(f"path: cannot write {os.fspath(path)!r} "
                                   f"({exc.strerror or exc})") from None
    return target
