"""A picture for each concept the seeds teach beyond the plain formula: multi-head
attention's data flow (drawn in :mod:`.dataflow`), flash attention's tiles, the KV
cache, positional encodings, sparse and low-rank attention.

    draw("flash", lang="zh")          # -> a matplotlib Figure
    draw_all("out/", lang="zh")       # dataflow.png, flash.png, kvcache.png, ...

The numbers come from :mod:`attnlab.lens.concepts` (which runs the fast paths)
and, for flash, from its plain twin :func:`attnlab.fast.flash_walk.flash_walk`;
this module only draws them. matplotlib is imported inside the functions.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import make_folder
from ..errors import AttnlabError
from ..fast.flash_walk import flash_walk
from ..lens.concepts import example_qkv, kv_cache_walk, position_patterns, sparse_patterns
from .dataflow import draw_dataflow
from .figures import new_figure, save_figure
from .fonts import font_context, warn_if_cjk_unrenderable
from .heatmap_parts import declutter_ticks, hatch_blocked
from .text import check_lang
from .words import CONCEPT_WORDS, Lang

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["CONCEPTS", "draw", "draw_all", "draw_dataflow", "draw_flash", "draw_kvcache",
           "draw_positions", "draw_sparse"]


def _cells(ax: Axes, rows: int, cols: int) -> None:
    """Integer ticks on a matrix: one per row and column."""
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows))


def _text(ax: Axes, families: list[str], title: str, xlabel: str = "", ylabel: str = "",
          ) -> None:
    ax.set_title(title, fontfamily=families, fontsize=9)
    ax.set_xlabel(xlabel, fontfamily=families, fontsize=8)
    ax.set_ylabel(ylabel, fontfamily=families, fontsize=8)
    ax.tick_params(labelsize=7)


def draw_flash(lang: Lang = "en", *, T: int = 4, S: int = 8, block_k: int = 2,
               seed: int = 0) -> Figure:
    """A step strip: per key tile, the scores read so far (the rest greyed), then the
    running max and running sum of each query after that tile."""
    check_lang(lang)
    words = CONCEPT_WORDS[lang]
    q, k, v = example_qkv(max(T, S), 4, seed=seed)
    walk = flash_walk(q[:T], k[:S], v[:S], block_k=block_k)
    n = len(walk.steps)
    edge = float(np.abs(walk.scores).max())
    with font_context() as families:
        warn_if_cjk_unrenderable(list(words.values()), families, "draw_flash")
        fig = new_figure((2.6 * n, 7.2))
        grid = fig.add_gridspec(3, n, height_ratios=[2.2, 1, 1])
        for col, step in enumerate(walk.steps):
            ax = fig.add_subplot(grid[0, col])
            ax.imshow(walk.scores, cmap="RdBu_r", vmin=-edge, vmax=edge, aspect="auto")
            unread = np.zeros_like(walk.scores, dtype=bool)
            unread[:, step.k1:] = True
            hatch_blocked(ax, ~unread)  # greys what is not read yet
            ax.add_patch(_outline(step.k0, step.k1, T))
            _cells(ax, T, S)
            for i in range(T):
                for j in range(step.k1):
                    ax.text(j, i, f"{walk.scores[i, j]:.1f}", ha="center", va="center",
                            fontsize=6, fontfamily=families)
            _text(ax, families, words["flash_tile"].format(n=col + 1, k0=step.k0,
                                                          k1=step.k1 - 1),
                  words["key"], words["query"] if col == 0 else "")
            for row, (values, name) in enumerate(((step.running_max, "flash_max"),
                                                  (step.running_sum, "flash_sum")), 1):
                ax = fig.add_subplot(grid[row, col])
                ax.barh(np.arange(T), values, color="#4c72b0" if row == 1 else "#dd8452")
                ax.set_yticks(range(T))
                ax.invert_yaxis()
                for i, value in enumerate(values):
                    ax.text(value, i, f" {value:.2f}", va="center", fontsize=6)
                _text(ax, families, words[name], "", words["query"] if col == 0 else "")
        fig.suptitle(words["flash_title"] + "\n" + words["flash_note"], fontfamily=families,
                     fontsize=9)
        declutter_ticks(fig)
    return fig


def _two_lines(text: str) -> str:
    """Break a panel title after its first colon (or, without one, near its middle)."""
    for colon in ("：", ": "):
        if colon in text:
            head, tail = text.split(colon, 1)
            return head + colon.strip() + "\n" + tail
    middle = text.find(" ", len(text) // 2)
    return text if middle < 0 else text[:middle] + "\n" + text[middle + 1:]


def _outline(k0: int, k1: int, T: int) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((k0 - 0.5, -0.5), k1 - k0, T, fill=False, edgecolor="black", linewidth=2)


def draw_kvcache(lang: Lang = "en", *, T: int = 8, window: int = 3, seed: int = 0) -> Figure:
    """Decoding step by step: what a full cache and a rolling window hold after each
    step (the position in each slot), and the new query's weights over what it sees."""
    check_lang(lang)
    words = CONCEPT_WORDS[lang]
    q, k, v = example_qkv(T, 4, seed=seed)
    walks = [kv_cache_walk(q, k, v), kv_cache_walk(q, k, v, window=window)]
    titles = [_two_lines(words["kv_full"]), _two_lines(words["kv_window"].format(W=window))]
    with font_context() as families:
        warn_if_cjk_unrenderable(list(words.values()), families, "draw_kvcache")
        fig = new_figure((13.0, 0.5 * T + 2.8))
        grid = fig.add_gridspec(1, 4, width_ratios=[T, T, window, T])
        for index, walk in enumerate(walks):
            slots = np.stack([s.slots for s in walk.steps])  # (T, capacity)
            weights = np.full((T, T), np.nan)
            for step in walk.steps:
                weights[step.position, step.seen] = step.weights
            held = slots >= 0
            ax = fig.add_subplot(grid[0, 2 * index])
            _cells(ax, T, slots.shape[1])
            ax.imshow(np.where(held, 1.0, 0.0), cmap="Greens", vmin=0, vmax=1.6, aspect="auto")
            hatch_blocked(ax, held)
            for t in range(T):
                for slot in np.flatnonzero(held[t]):
                    new = slots[t, slot] == t
                    ax.text(int(slot), t, str(slots[t, slot]), ha="center", va="center", fontsize=7,
                            fontweight="bold" if new else "normal",
                            color="#b22222" if new else "black")
            _text(ax, families, titles[index], words["slot"], words["step"])
            ax = fig.add_subplot(grid[0, 2 * index + 1])
            _cells(ax, T, T)
            seen = ~np.isnan(weights)
            ax.imshow(np.nan_to_num(weights), cmap="YlGnBu", vmin=0, vmax=1, aspect="auto")
            hatch_blocked(ax, seen)
            for t, j in zip(*np.nonzero(seen), strict=True):
                ax.text(j, t, f"{weights[t, j]:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if weights[t, j] > 0.6 else "black")
            _text(ax, families, _two_lines(words["kv_weights"]), words["position"], "")
        fig.suptitle(words["kv_title"] + "\n" + words["kv_note"], fontfamily=families,
                     fontsize=9)
        declutter_ticks(fig)
    return fig


def draw_positions(lang: Lang = "en", *, T: int = 32, d_model: int = 16, head_dim: int = 8,
                   ) -> Figure:
    """The sinusoidal table and its similarity; RoPE's angles and relative scores."""
    check_lang(lang)
    words = CONCEPT_WORDS[lang]
    data = position_patterns(T, d_model, head_dim)
    panels = [
        (data.sinusoidal, "pos_table", words["dim"], "RdBu_r", (-1.0, 1.0)),
        (data.similarity, "pos_similarity", words["position"], "viridis", (None, None)),
        (data.rope_angles, "rope_angles", words["pair"], "twilight", (-np.pi, np.pi)),
        (data.rope_scores, "rope_scores", words["position"], "RdBu_r", (None, None)),
    ]
    with font_context() as families:
        warn_if_cjk_unrenderable(list(words.values()), families, "draw_positions")
        # 2 × 2, titles wrapped: four long titles in one row overlapped and the last was
        # clipped at the figure's edge
        fig = new_figure((10.0, 8.0))
        for index, (values, key, xlabel, cmap, (low, high)) in enumerate(panels):
            ax = fig.add_subplot(2, 2, index + 1)
            if low is None:
                edge = float(np.abs(values).max())
                low, high = (-edge, edge) if cmap == "RdBu_r" else (values.min(), values.max())
            image = ax.imshow(values, cmap=cmap, vmin=low, vmax=high, aspect="auto",
                              interpolation="nearest")
            fig.colorbar(image, ax=ax, shrink=0.8)
            title = textwrap.fill(words[key], 44 if lang == "en" else 22)
            _text(ax, families, title, xlabel, words["position"])
        fig.suptitle(words["pos_title"], fontfamily=families, fontsize=10)
    return fig


def draw_sparse(lang: Lang = "en", *, T: int = 24, window: int = 5, block_size: int = 3,
                rank: int = 4) -> Figure:
    """The keys each query keeps (window, window + global token, BigBird blocks), and
    exact weights beside the weights Linformer and Nyström use instead."""
    check_lang(lang)
    words = CONCEPT_WORDS[lang]
    data = sparse_patterns(T, window=window, block_size=block_size, rank=rank)
    total = T * T
    with font_context() as families:
        warn_if_cjk_unrenderable(list(words.values()), families, "draw_sparse")
        fig = new_figure((13.0, 7.0))
        for index, (name, mask) in enumerate(data.masks.items()):
            ax = fig.add_subplot(2, 3, index + 1)
            ax.imshow(mask, cmap="Blues", vmin=0, vmax=1.3, aspect="equal",
                      interpolation="nearest")
            title = words[name].format(kept=int(mask.sum()), total=total, **data.settings)
            _text(ax, families, title, words["key"], words["query"])
        panels = [("exact", data.exact)] + list(data.approximations.items())
        high = max(float(p.max()) for _, p in panels)
        for index, (name, values) in enumerate(panels):
            ax = fig.add_subplot(2, 3, 4 + index)
            ax.imshow(values, cmap="YlGnBu", vmin=min(0.0, float(values.min())), vmax=high,
                      aspect="equal", interpolation="nearest")
            _text(ax, families, words[name].format(**data.settings), words["key"],
                  words["query"])
        fig.suptitle(words["sparse_title"], fontfamily=families, fontsize=10)
    return fig


#: ``attnlab draw NAME``: name -> drawing function.
CONCEPTS: dict[str, Callable[[Lang], Figure]] = {
    "dataflow": draw_dataflow, "flash": draw_flash, "kvcache": draw_kvcache,
    "positions": draw_positions, "sparse": draw_sparse,
}


def draw(name: str, *, lang: Lang = "en") -> Figure:
    """The picture of one concept: "dataflow", "flash", "kvcache", "positions" or
    "sparse"."""
    if name not in CONCEPTS:
        raise AttnlabError(f"name: expected one of {list(CONCEPTS)}, got {name!r}")
    return CONCEPTS[name](check_lang(lang))


def draw_all(out_dir: str | Path, *, lang: Lang = "en",
             names: list[str] | None = None) -> list[Path]:
    """Write ``<name>.png`` for each concept (all by default) into ``out_dir``."""
    chosen = list(CONCEPTS) if names is None else names
    for name in chosen:
        if name not in CONCEPTS:
            raise AttnlabError(f"names: expected names from {list(CONCEPTS)}, got {name!r}")
    folder = make_folder(out_dir, "out_dir")
    return [save_figure(draw(name, lang=lang), folder / f"{name}.png") for name in chosen]
