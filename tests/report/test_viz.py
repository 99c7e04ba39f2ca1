"""Heatmaps: Chinese labels really drawn, layouts, colour scales and every input error."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib")  # the viz extra; the set-up installs it

from matplotlib import font_manager, ft2font  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attnlab.errors import AttnlabError, ShapeError
from attnlab.report import fonts  # noqa: E402
from attnlab.report.heatmaps import (  # noqa: E402
    CJK_FONT_ENV,
    MissingCJKFontWarning,
    find_cjk_font,
    font_context,
    plot_attention,
    plot_head_grid,
    save_figure,
)

WORDS = ["小明", "去了", "学校"]
HEADS = np.full((2, 3, 3), 0.3)  # (H, T, S)
LAYERS = np.full((2, 2, 3, 3), 0.3)  # (L, H, T, S)
# Rows sum to 1; the 0.80 cell is dark blue in YlGnBu, the 0.10 cells pale yellow.
WEIGHTS = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
NO_FONT_MESSAGE = (
    "No font with CJK glyphs was found. The project's set-up installs one "
    "(apt-get install fonts-noto-cjk); or point ATTNLAB_CJK_FONT at a CJK font file."
)


def panel_axes(fig: Figure) -> list[Axes]:
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def grid_shape(ax: Axes) -> tuple[int, int]:
    spec = ax.get_subplotspec()
    assert spec is not None
    rows, cols = spec.get_geometry()[:2]
    return rows, cols


def glyph_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if "missing from font" in str(w.message) or issubclass(w.category, MissingCJKFontWarning)
    ]


def render_char(char: str, families: list[str]) -> np.ndarray:
    """Pixels of one character drawn big and alone with the given font fallback list."""
    fig = Figure(figsize=(1, 1), dpi=60)
    canvas = FigureCanvasAgg(fig)
    fig.text(0.5, 0.5, char, fontsize=40, fontfamily=families, ha="center", va="center")
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


# ----------------------------------------------------------------- CJK fonts


def test_cjk_font_is_installed_and_covers_the_seed_words() -> None:
    family = find_cjk_font()
    assert family is not None, NO_FONT_MESSAGE
    fname = font_manager.findfont(family, fallback_to_default=False)
    font = ft2font.FT2Font(fname, face_index=getattr(fname, "face_index", 0))  # .ttc faces
    for char in "".join(WORDS) + "注意力权重热图查询键单词头层":
        assert font.get_char_index(ord(char)) != 0, f"{family} ({fname}) has no glyph for {char}"


def test_cjk_glyphs_are_drawn_not_boxes() -> None:
    with font_context() as families:
        assert len(families) == 2, NO_FONT_MESSAGE
    xue, xiao = render_char("学", families), render_char("小", families)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tofu reference warns on purpose
        tofu_xue = render_char("学", ["DejaVu Sans"])
        tofu_xiao = render_char("小", ["DejaVu Sans"])
    # A missing glyph draws the same box for every character; real glyphs differ.
    assert np.array_equal(tofu_xue, tofu_xiao)
    assert not np.array_equal(xue, xiao)
    assert not np.array_equal(xue, tofu_xue)
    assert (xue < 128).any(), "the glyph left no ink"


def test_chinese_heatmap_saves_png_and_svg_without_missing_glyphs(tmp_path: Path) -> None:
    assert find_cjk_font() is not None, NO_FONT_MESSAGE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = plot_attention(WEIGHTS, WORDS, WORDS, title="注意力权重热图 (Query 小明)", lang="zh")
        png = save_figure(fig, tmp_path / "nested" / "heat.png")
        svg = save_figure(fig, tmp_path / "heat.svg")
        # Text keeps its font families outside attnlab's context too (plain savefig).
        fig.savefig(io.BytesIO(), format="png")
    assert glyph_warnings(caught) == []

    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert (width, height) == (round(5.5 * 150), round(4.5 * 150))
    assert 10_000 < len(data) < 2_000_000

    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")
    assert not [el for el in root.iter() if el.tag.endswith("text")], "glyphs must be outlines"
    assert "<dc:date>" not in svg.read_text(encoding="utf-8")


def test_no_cjk_font_warns_with_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fonts, "find_cjk_font", lambda: None)
    with font_context() as families:
        assert families == ["DejaVu Sans"]
    with pytest.warns(MissingCJKFontWarning, match="apt-get install fonts-noto-cjk") as record:
        plot_attention(WEIGHTS, WORDS, WORDS)
    assert CJK_FONT_ENV in str(record[0].message)
    with pytest.warns(MissingCJKFontWarning, match="plot_head_grid"):
        plot_head_grid(np.full((2, 3, 3), 0.3), lang="zh")  # default labels are 单词1..3
    with warnings.catch_warnings():
        warnings.simplefilter("error", MissingCJKFontWarning)
        plot_attention(WEIGHTS, ["I", "went", "home"], ["I", "went", "home"], title="Query")


def test_env_variable_names_the_font(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    family = find_cjk_font()
    assert family is not None, NO_FONT_MESSAGE
    fname = font_manager.findfont(family, fallback_to_default=False)
    monkeypatch.setenv(CJK_FONT_ENV, os.fspath(fname))
    chosen = find_cjk_font()
    assert chosen is not None
    assert Path(font_manager.findfont(chosen, fallback_to_default=False)) == Path(fname)

    monkeypatch.setenv(CJK_FONT_ENV, str(tmp_path / "absent.ttf"))
    with pytest.raises(AttnlabError, match="ATTNLAB_CJK_FONT: expected the path of a font file"):
        find_cjk_font()
    latin = font_manager.findfont("DejaVu Sans", fallback_to_default=False)
    monkeypatch.setenv(CJK_FONT_ENV, latin)
    with pytest.raises(AttnlabError, match="ATTNLAB_CJK_FONT: expected a font with CJK glyphs"):
        find_cjk_font()


def test_fonts_missing_from_matplotlibs_cache_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # As after `apt-get install fonts-noto-cjk` on a machine whose matplotlib font
    # cache was built before: the font is on disk but not in fontManager.ttflist.
    assert find_cjk_font() is not None, NO_FONT_MESSAGE
    manager = font_manager.fontManager
    latin_only = [e for e in manager.ttflist if "DejaVu" in e.name]
    monkeypatch.setattr(manager, "ttflist", list(latin_only))
    monkeypatch.delenv(CJK_FONT_ENV, raising=False)
    fonts.clear_font_cache()
    try:
        family = find_cjk_font()
        assert family is not None
        assert len(manager.ttflist) > len(latin_only)  # registered so the name resolves
    finally:
        fonts.clear_font_cache()


# ------------------------------------------------------------ plot_attention


def test_heatmap_rows_are_queries_with_readable_annotations() -> None:
    fig = plot_attention(WEIGHTS)
    ax, colorbar = fig.axes
    assert colorbar.get_label() == "<colorbar>"
    image = ax.get_images()[0]
    np.testing.assert_array_equal(image.get_array(), WEIGHTS)  # row t = query t
    assert image.get_clim() == (0.0, 1.0)
    assert image.cmap.name == "YlGnBu"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("Key", "Query")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["word 1", "word 2", "word 3"]
    cells = {(t.get_position(), t.get_text()): t.get_color() for t in ax.texts}
    assert len(cells) == 9
    assert cells[((1, 1), "0.80")] == "white"  # dark cell
    assert cells[((2, 0), "0.10")] == "black"  # pale cell: x = key 2, y = query 0


def test_heatmap_chinese_defaults_and_options() -> None:
    fig = plot_attention(WEIGHTS, lang="zh", annotate=False, cmap="viridis")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("键 (Key)", "查询 (Query)")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["单词1", "单词2", "单词3"]
    assert len(ax.texts) == 0
    assert ax.get_images()[0].cmap.name == "viridis"
    assert len(plot_attention(np.full((11, 10), 0.1)).axes[0].texts) == 0  # > 100 cells
    assert len(plot_attention(np.full((11, 10), 0.1), annotate=True).axes[0].texts) == 110


def test_heatmap_raw_scores_use_an_automatic_scale() -> None:
    scores = np.array([[-2.0, 0.5], [3.0, 1.0]])
    image = plot_attention(scores, vmin=None, vmax=None).axes[0].get_images()[0]
    assert image.get_clim() == (-2.0, 3.0)
    constant = plot_attention(np.full((2, 2), 0.25), vmax=None).axes[0].get_images()[0]
    assert constant.get_clim() == (0.0, 0.25)
    flat = plot_attention(np.full((2, 2), 5.0), vmin=None, vmax=None).axes[0].get_images()[0]
    assert flat.get_clim() == (4.5, 5.5)
    # Softmax rounding a hair above 1 is not an error.
    plot_attention(np.array([[1.0 + 1e-9, 0.0]]))


def test_heatmap_into_a_given_axes_and_long_sequences() -> None:
    fig = Figure()
    left, right = fig.subplots(1, 2)
    assert plot_attention(WEIGHTS, WORDS, WORDS, ax=right) is fig
    assert right.get_images() and not left.get_images()
    assert [t.get_text() for t in right.get_xticklabels()] == WORDS

    long = np.full((45, 45), 1 / 45)
    ax = plot_attention(long).axes[0]
    assert len(ax.texts) == 0
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert "word 1" not in labels and len(labels) < 45  # integer positions, not 45 labels


# ------------------------------------------------------------ plot_head_grid


def test_grid_of_layers_and_heads() -> None:
    rng = np.random.default_rng(0)
    weights = rng.random((2, 4, 5, 5))
    weights /= weights.sum(-1, keepdims=True)
    fig = plot_head_grid(weights, title="Layers")
    panels = panel_axes(fig)
    assert len(panels) == 8
    assert {grid_shape(ax) for ax in panels} == {(2, 4)}
    assert [ax.get_title() for ax in panels][:2] == ["Layer 1 · Head 1", "Layer 1 · Head 2"]
    assert panels[5].get_title() == "Layer 2 · Head 2"
    np.testing.assert_array_equal(panels[5].get_images()[0].get_array(), weights[1, 1])
    assert {ax.get_images()[0].get_clim() for ax in panels} == {(0.0, 1.0)}  # shared scale
    assert len(fig.axes) - len(panels) == 1  # one colour bar for all
    assert fig.get_suptitle() == "Layers"


def test_grid_of_heads_and_outer_labels() -> None:
    fig = plot_head_grid(np.full((3, 5, 5), 0.2), list("abcde"), lang="zh")
    panels = panel_axes(fig)
    assert len(panels) == 3
    assert {grid_shape(ax) for ax in panels} == {(1, 3)}
    assert [ax.get_title() for ax in panels] == ["头 1", "头 2", "头 3"]
    assert [ax.get_ylabel() for ax in panels] == ["查询 (Query)", "", ""]
    assert all(ax.get_xlabel() == "键 (Key)" for ax in panels)

    five = panel_axes(plot_head_grid(np.full((5, 4, 4), 0.25)))
    assert grid_shape(five[0]) == (2, 3)
    # Head 3 has no panel below it, so it carries the Key axis name; head 2 does not.
    assert (five[2].get_xlabel(), five[1].get_xlabel()) == ("Key", "")

    two_cols = panel_axes(plot_head_grid(np.full((5, 4, 4), 0.25), ncols=2, titles=list("ABCDE")))
    assert grid_shape(two_cols[0]) == (3, 2)
    assert [ax.get_title() for ax in two_cols] == list("ABCDE")


def test_grid_skips_tick_labels_for_long_sequences() -> None:
    fig = plot_head_grid(np.full((1, 2, 41, 41), 1 / 41))
    labels = [t.get_text() for t in panel_axes(fig)[0].get_xticklabels()]
    assert "word 1" not in labels and len(labels) < 41


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("weights", "kwargs", "error", "match"),
    [
        (np.ones(3), {}, ShapeError, r"weights: expected \(T, S\) with T, S >= 1, got \(3\)"),
        (np.ones((2, 2, 2)), {}, ShapeError, r"weights: expected \(T, S\)"),
        (np.ones((0, 3)), {}, ShapeError, r"got \(0, 3\)"),
        ([[0.5, np.nan]], {}, AttnlabError, "weights: expected finite values"),
        ([["a", "b"]], {}, AttnlabError, "weights: expected a real float"),
        ([[0.5, 1.5]], {}, AttnlabError, r"weights: expected values in \[vmin, vmax\] = \[0, 1\]"),
        ([[-0.5, 0.5]], {}, AttnlabError, "pass vmin=None, vmax=None"),
        (WEIGHTS, {"vmin": 0.5, "vmax": 0.5}, AttnlabError, "vmin, vmax: expected vmin < vmax"),
        (WEIGHTS, {"vmax": "1"}, AttnlabError, "vmax: expected a number or None"),
        (WEIGHTS, {"vmin": float("nan")}, AttnlabError, "vmin: expected a finite number"),
        (
            WEIGHTS,
            {"query_labels": ["a", "b"]},
            AttnlabError,
            r"query_labels: expected 3 labels \(T = 3\)",
        ),
        (WEIGHTS, {"key_labels": "abc"}, AttnlabError, "key_labels: expected a sequence"),
        (WEIGHTS, {"key_labels": 3}, AttnlabError, "key_labels: expected a sequence"),
        (WEIGHTS, {"lang": "fr"}, AttnlabError, "lang: expected one of 'en', 'zh', got 'fr'"),
        (WEIGHTS, {"title": 3}, AttnlabError, "title: expected a str or None, got int"),
        (WEIGHTS, {"annotate": "yes"}, AttnlabError, "annotate: expected True, False or None"),
        (WEIGHTS, {"cmap": "NoSuchMap"}, AttnlabError, "cmap: expected a matplotlib colormap"),
        (WEIGHTS, {"ax": "left"}, AttnlabError, "ax: expected a matplotlib Axes or None, got str"),
    ],
)
def test_plot_attention_errors(weights, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        plot_attention(weights, **kwargs)


@pytest.mark.parametrize(
    ("weights", "kwargs", "error", "match"),
    [
        (np.full((3, 3), 0.3), {}, ShapeError, r"weights: expected \(H, T, S\) or \(L, H, T, S\)"),
        (np.full((1, 1, 1, 3, 3), 0.3), {}, ShapeError, r"got \(1, 1, 1, 3, 3\)"),
        (np.full((2, 0, 3), 0.3), {}, ShapeError, r"got \(2, 0, 3\)"),
        (np.full((2, 3, 3), 1.2), {}, AttnlabError, r"weights: expected values in \[vmin, vmax\]"),
        (np.full((2, 3, 3), np.inf), {}, AttnlabError, "weights: expected finite values"),
        (HEADS, {"titles": ["a"]}, AttnlabError, r"titles: expected 2 labels \(H = 2\)"),
        (LAYERS, {"titles": ["a"] * 2}, AttnlabError, r"titles: expected 4 labels \(L \* H"),
        (LAYERS, {"ncols": 2}, AttnlabError, r"ncols: only for \(H, T, S\)"),
        (HEADS, {"ncols": 0}, AttnlabError, "ncols: expected an integer >= 1"),
        (HEADS, {"query_labels": ["a"]}, AttnlabError, r"query_labels: expected 3 labels"),
        (HEADS, {"lang": "de"}, AttnlabError, "lang: expected one of"),
        (HEADS, {"title": ["x"]}, AttnlabError, "title: expected a str or None"),
    ],
)
def test_plot_head_grid_errors(weights, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        plot_head_grid(weights, **kwargs)


def test_save_figure_errors(tmp_path: Path) -> None:
    fig = plot_attention(WEIGHTS)
    with pytest.raises(
        AttnlabError,
        match=r"path: expected a file name ending in \.png or \.svg, got '.*heat\.pdf'",
    ):
        save_figure(fig, tmp_path / "heat.pdf")
    with pytest.raises(AttnlabError, match="path: expected a file name ending in"):
        save_figure(fig, tmp_path / "heat")
    with pytest.raises(AttnlabError, match="path: expected a str or os.PathLike, got int"):
        save_figure(fig, 3)  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match="fig: expected a matplotlib Figure, got Axes"):
        save_figure(fig.axes[0], tmp_path / "heat.png")  # type: ignore[arg-type]
    for dpi in (0, -5, float("inf"), "150", True):
        with pytest.raises(AttnlabError, match="dpi: expected a positive number"):
            save_figure(fig, tmp_path / "heat.png", dpi=dpi)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []  # nothing written on error
    assert save_figure(fig, str(tmp_path / "HEAT.PNG"), dpi=50).stat().st_size > 1000


def test_missing_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install 'attnlab\[viz\]'"):
        plot_attention(WEIGHTS)
    with pytest.raises(ImportError, match="Plotting needs the 'matplotlib' package"):
        find_cjk_font()


def test_plotting_never_imports_pyplot(tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "from attnlab.report.heatmaps import plot_attention, plot_head_grid, save_figure\n"
        "fig = plot_attention(np.eye(3), ['小明', '去了', '学校'])\n"
        f"save_figure(fig, {str(tmp_path / 'a.png')!r})\n"
        "plot_head_grid(np.full((2, 2, 2), 0.5))\n"
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("MPLBACKEND", None)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # library code never prints


def test_tokens_no_font_has_are_drawn_without_warnings(tmp_path):
    """An emoji or control-character token printed two warning lines per glyph and file."""
    fig = plot_attention(np.eye(2), ["🙂", "\x01"], ["🙂", "\x01"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("tokens.png", "tokens.svg"):
            assert save_figure(fig, tmp_path / name).stat().st_size > 0


# ----------------------------------------------------------------- labels are text


def test_dollar_signs_in_labels_and_titles_are_drawn_as_typed(tmp_path) -> None:
    """matplotlib reads "$...$" as math: "$$ x" would end in a ParseException and "$x$"
    would be drawn as an italic x. Token labels and titles are text."""
    labels = ["$$", "$x$", "a$b"]
    fig = plot_attention(WEIGHTS, labels, labels, title="$x$ title")
    grid = plot_head_grid(HEADS, labels, labels, title="$$ grid")
    for figure in (fig, grid):
        save_figure(figure, tmp_path / "f.png")  # draws: no ParseException
        texts = [t for ax in figure.axes if ax.get_label() != "<colorbar>"
                 for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
        texts += [t for t in figure.findobj(lambda a: hasattr(a, "get_parse_math"))
                  if "$" in t.get_text()]
        assert texts and all(not t.get_parse_math() for t in texts if "$" in t.get_text())
    # Drawn as typed: "$x$" is as wide as three plain glyphs, not one italic x.
    canvas = FigureCanvasAgg(Figure())
    renderer = canvas.get_renderer()
    tick = next(t for t in fig.axes[0].get_xticklabels() if t.get_text() == "$x$")
    as_math = Figure().text(0, 0, "$x$", fontsize=tick.get_fontsize())
    as_math.figure.canvas = FigureCanvasAgg(as_math.figure)
    assert (tick.get_window_extent(fig.canvas.get_renderer()).width
            > 1.5 * as_math.get_window_extent(renderer).width)


def test_explain_draws_tokens_with_dollar_signs(capsys, tmp_path) -> None:
    from attnlab.cli import main

    code = main(["explain", "--tokens", "$$ x $y$", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert (tmp_path / "heatmap.png").stat().st_size > 0


def test_a_placeholder_font_is_not_a_cjk_font(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib >= 3.10 bundles "Last Resort", which maps every code point to a box:
    without a real CJK font it must not be taken for one (the Chinese would be boxes,
    and MissingCJKFontWarning would stay silent)."""
    import matplotlib

    placeholder = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "LastResortHE-Regular.ttf"
    if not placeholder.is_file():
        pytest.skip(f"matplotlib {matplotlib.__version__} bundles no Last Resort font")
    manager = font_manager.fontManager
    if not any(Path(e.fname) == placeholder for e in manager.ttflist):
        manager.addfont(os.fspath(placeholder))
    kept = [e for e in manager.ttflist
            if "DejaVu" in e.name or Path(e.fname) == placeholder]
    monkeypatch.setattr(manager, "ttflist", kept)
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda *a, **k: [])
    monkeypatch.delenv(CJK_FONT_ENV, raising=False)
    fonts.clear_font_cache()
    try:
        assert find_cjk_font() is None
        with pytest.warns(MissingCJKFontWarning):
            plot_attention(WEIGHTS, WORDS, WORDS)
        monkeypatch.setenv(CJK_FONT_ENV, os.fspath(placeholder))
        with pytest.raises(AttnlabError, match="expected a font with CJK glyphs"):
            find_cjk_font()
    finally:
        fonts.clear_font_cache()
