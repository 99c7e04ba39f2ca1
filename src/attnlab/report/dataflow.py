"""Multi-head attention's data flow with the shape of every tensor, and the two ways a
block wraps it in a residual connection and LayerNorm (post-LN and pre-LN).

    draw_dataflow("zh", T=3, num_heads=2, d_model=8)   # -> a matplotlib Figure

A diagram, not a computation: the shapes are worked out from T, H and E the way the
code does (D = Dv = E / H), and written next to each box. matplotlib is imported
inside the functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checks import check_positive_int
from ..errors import AttnlabError
from ..messages import msg
from .figures import new_figure
from .fonts import font_context, warn_if_cjk_unrenderable
from .text import check_lang
from .words import CONCEPT_WORDS, Lang

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["dataflow_shapes", "draw_dataflow"]


def dataflow_shapes(T: int, num_heads: int, d_model: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """The flow's steps, top to bottom: (word key, symbolic shape, shape in numbers)."""
    H, E = num_heads, d_model
    D = E // H
    return [
        ("df_x", "(T, E)", (T, E)),
        ("df_qkv", "(T, E)", (T, E)),
        ("df_split", "(H, T, D)", (H, T, D)),            # view(T, H, D).transpose
        ("df_scores", "(H, T, T)", (H, T, T)),
        ("df_weights", "(H, T, T)", (H, T, T)),
        ("df_heads", "(H, T, Dv)", (H, T, D)),
        ("df_concat", "(T, H·Dv)", (T, H * D)),          # transpose back, reshape
        ("df_out", "(T, E)", (T, E)),
    ]


def _shape_text(symbols: str, numbers: tuple[int, ...]) -> str:
    return f"{symbols} = ({', '.join(str(n) for n in numbers)})"


def _box(ax: Axes, x: float, y: float, text: str, families: list[str], colour: str,
         size: float = 8) -> None:
    ax.text(x, y, text, ha="center", va="center", fontsize=size, fontfamily=families,
            bbox={"boxstyle": "round,pad=0.4", "facecolor": colour, "edgecolor": "#555555"})


def _arrow(ax: Axes, start: tuple[float, float], end: tuple[float, float],
           style: str = "-|>", connection: str = "arc3") -> None:
    ax.annotate("", xy=end, xytext=start,
                arrowprops={"arrowstyle": style, "color": "#333333", "lw": 1.2,
                            "connectionstyle": connection, "shrinkA": 9, "shrinkB": 9})


def _block(ax: Axes, words: dict[str, str], families: list[str], T: int, E: int, *,
           pre: bool) -> None:
    """One residual block: boxes bottom-up, with the skip connection drawn beside them."""
    shape = _shape_text("(T, E)", (T, E))  # every tensor in the block is (T, E)
    attention = f"{words['df_attention']}\n{shape}"
    norm, add = words["df_norm"], words["df_add"]
    steps = ([norm, attention, add] if pre else [attention, add, norm])
    colours = {norm: "#f2e1c7", attention: "#cfe0f3", add: "#e3e3e3"}
    xs, ys = 0.5, [0.08, 0.3, 0.5, 0.7, 0.92]
    _box(ax, xs, ys[0], "x", families, "white", 9)
    for y, step in zip(ys[1:4], steps, strict=True):
        _box(ax, xs, y, step, families, colours[step])
    _box(ax, xs, ys[4], words["df_block_out"], families, "white", 9)
    for low, high in zip(ys, ys[1:], strict=False):
        _arrow(ax, (xs, low), (xs, high))
    add_y = ys[1 + steps.index(add)]
    # the residual: x goes around the sublayer(s) straight into the addition
    side = 0.8
    ax.plot([xs + 0.06, side, side], [ys[0], ys[0], add_y], color="#333333", lw=1.2)
    _arrow(ax, (side + 0.05, add_y), (xs + 0.05, add_y))
    ax.text(side + 0.07, (ys[0] + add_y) / 2, words["df_residual"], ha="center", va="center",
            rotation=90, fontsize=7, fontfamily=families, color="#555555")
    ax.text(0.5, -0.04, words["df_pre_formula" if pre else "df_post_formula"],
            ha="center", va="center", fontsize=8, fontfamily=families)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.1, 1.0)
    ax.axis("off")
    ax.set_title(words["df_pre" if pre else "df_post"], fontfamily=families, fontsize=9)


def draw_dataflow(lang: Lang = "en", *, T: int = 3, num_heads: int = 2, d_model: int = 8,
                  ) -> Figure:
    """Multi-head attention from X (T, E) to the output (T, E), each tensor's shape
    written with the numbers for ``T``, ``num_heads`` and ``d_model``; beside it the
    post-LN and pre-LN blocks. Raises AttnlabError for sizes that are not positive
    integers or a ``d_model`` that ``num_heads`` does not divide."""
    check_lang(lang)
    T = check_positive_int(T, "T")
    H = check_positive_int(num_heads, "num_heads")
    E = check_positive_int(d_model, "d_model")
    if E % H:
        raise AttnlabError(msg("draw.d_model_heads", heads=H, got=E))
    words = CONCEPT_WORDS[lang]
    steps = dataflow_shapes(T, H, E)
    with font_context() as families:
        warn_if_cjk_unrenderable(list(words.values()), families, "draw_dataflow")
        fig = new_figure((12.0, 7.6))
        grid = fig.add_gridspec(1, 3, width_ratios=[2.0, 1.0, 1.0])
        ax = fig.add_subplot(grid[0, 0])
        n = len(steps)
        ys = [1.0 - i / (n - 1) for i in range(n)]
        for y, (key, symbols, numbers) in zip(ys, steps, strict=True):
            _box(ax, 0.36, y, words[key], families, "#cfe0f3" if key != "df_x" else "white")
            ax.text(0.74, y, _shape_text(symbols, numbers), ha="left", va="center",
                    fontsize=9, fontfamily="DejaVu Sans Mono")
        for high, low in zip(ys, ys[1:], strict=False):
            _arrow(ax, (0.36, high), (0.36, low))
        ax.set_xlim(0, 1.05)
        ax.set_ylim(-0.08, 1.08)
        ax.axis("off")
        ax.set_title(words["df_flow"], fontfamily=families, fontsize=9)
        _block(fig.add_subplot(grid[0, 1]), words, families, T, E, pre=False)
        _block(fig.add_subplot(grid[0, 2]), words, families, T, E, pre=True)
        legend = words["df_legend"].format(T=T, H=H, E=E, D=E // H)
        fig.suptitle(words["df_title"] + "\n" + legend, fontfamily=families, fontsize=10)
    return fig
