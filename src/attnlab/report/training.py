"""Pictures and a page of a training run: the loss and head scores against steps
(``training.png``) and the attention at every snapshot behind a slider (``view.html``).

Everything here takes plain arrays (what :class:`attnlab.train.TrainResult` holds),
so it needs matplotlib for the plot and nothing for the page, never torch.

Dimension legend: N steps, K snapshots, L layers, H heads, T tokens.

The page is one self-contained file, safe by construction, as the attention viewer
(:mod:`attnlab.report.viewer`): its template, CSS and JavaScript are package data
(``assets/training.*``); the data is JSON in ``<script type="application/json">``
with ``<``, ``>`` and ``&`` escaped; tokens are inserted with ``textContent``; the
title is HTML-escaped; a Content-Security-Policy allows only the page's own script
and style (by hash) and no network. Weights are embedded as integers in thousandths.

>>> import numpy as np
>>> page = training_html(np.full((2, 1, 1, 2, 2), 0.5), [0, 10], ["<b>", "&"])
>>> page.startswith("<!DOCTYPE html>"), "<b>" in page
(True, False)
"""

from __future__ import annotations

import functools
import html
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import check_text, shape_str
from ..errors import AttnlabError, ShapeError
from .figures import new_figure
from .fonts import font_context, warn_if_cjk_unrenderable
from .page import page_csp, script_json
from .text import check_lang
from .words import Lang

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["TRAINING_WORDS", "plot_training", "training_html"]

TRAINING_WORDS: dict[str, dict[str, Any]] = {
    "en": {
        "title": "Attention during training", "step": "step", "play": "play",
        "pause": "pause", "layer": "layer", "head": "head", "heatmap": "Attention",
        "scores": "Head scores at this step", "heldout_loss": "held-out loss",
        "hint": "Drag the slider to watch the heads change; the dashed cells are where an "
                "induction head looks (the token after the earlier copy of the current one).",
        "loss": "loss", "training_loss": "training loss", "score": "score (best head)",
        "phase_change": "largest change", "layer_n": "layer {n}",
        "detectors": {"previous_token": "previous token", "duplicate_token": "duplicate token",
                      "induction": "induction", "next_output": "next output"},
    },
    "zh": {
        "title": "训练中的注意力", "step": "步", "play": "播放", "pause": "暂停",
        "layer": "层", "head": "头", "heatmap": "注意力", "scores": "这一步各个头的得分",
        "heldout_loss": "留出集损失",
        "hint": "拖动滑块，看各个头如何变化；虚线格是归纳头（induction head）关注的位置："
                "当前词上一次出现之后的那个词。",
        "loss": "损失", "training_loss": "训练损失", "score": "得分（最佳的头）",
        "phase_change": "变化最大处", "layer_n": "第 {n} 层",
        "detectors": {"previous_token": "前一个词", "duplicate_token": "重复词",
                      "induction": "归纳", "next_output": "下一个输出"},
    },
}


@functools.cache
def _asset(name: str) -> str:
    """A file of ``attnlab/report/assets`` (package data), read once."""
    return resources.files(__package__).joinpath(f"assets/{name}").read_text(encoding="utf-8")


def _check_history(head_history: Mapping[str, Any], K: int) -> dict[str, np.ndarray]:
    if not isinstance(head_history, Mapping):
        raise AttnlabError(f"head_history: expected a dict of (K, L, H) arrays, got "
                           f"{type(head_history).__name__}")
    out = {}
    for name, values in head_history.items():
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 3 or arr.shape[0] != K:
            raise ShapeError(f"head_history[{name!r}]: expected (K, L, H) with K = {K}, "
                             f"got {shape_str(arr.shape)}")
        out[str(name)] = arr
    return out


def plot_training(
    losses: Any,
    snapshot_steps: Sequence[int],
    head_history: Mapping[str, Any],
    *,
    phase_change_step: int | None = None,
    heldout_loss: Any = None,
    title: str | None = None,
    lang: Lang = "en",
) -> Figure:
    """Training loss (N,) against steps 1..N, and, per detector and layer, the best head's
    score (K, L, H) -> (K,) against the snapshot steps; the phase change marked."""
    check_lang(lang)
    words = TRAINING_WORDS[lang]
    loss = np.asarray(losses, dtype=np.float64)
    if loss.ndim != 1:
        raise ShapeError(f"losses: expected (N,), got {shape_str(loss.shape)}")
    steps = [int(s) for s in snapshot_steps]
    history = _check_history(head_history, len(steps))
    fig = new_figure((9.0, 3.6), feature="The training plot")
    with font_context() as families:  # text keeps the fonts it is created with
        warn_if_cjk_unrenderable([words["step"], str(title or "")], families, "plot_training")
        _draw(fig, words, loss, steps, history, phase_change_step, heldout_loss, title)
    return fig


def _draw(fig: Figure, words: dict[str, Any], loss: np.ndarray, steps: list[int],
          history: dict[str, np.ndarray], phase_change_step: int | None, heldout_loss: Any,
          title: str | None) -> None:
    ax_loss, ax_score = fig.subplots(1, 2)
    finite = np.isfinite(loss)
    ax_loss.plot(np.arange(1, len(loss) + 1)[finite], loss[finite], lw=0.8, color="#3465a4",
                 label=words["training_loss"])
    if heldout_loss is not None:
        held = np.asarray(heldout_loss, dtype=np.float64)
        if held.shape != (len(steps),):
            raise ShapeError(f"heldout_loss: expected K = {len(steps)} values, got "
                             f"{shape_str(held.shape)}")
        ax_loss.plot(steps, held, "o-", ms=2.5, lw=1.0, color="#f57900",
                     label=words["heldout_loss"])
        ax_loss.legend(fontsize=7, loc="upper right")
    if finite.any() and loss[finite].min() > 0 and loss[finite].max() > 20 * loss[finite].min():
        ax_loss.set_yscale("log")  # only when it spans decades: sort's loss falls to ~1e-4
    ax_loss.set_xlabel(words["step"])
    ax_loss.set_ylabel(words["loss"])
    colours = {"next_output": "#3465a4", "previous_token": "#4e9a06",
               "duplicate_token": "#c4a000", "induction": "#cc0000"}
    styles = ["-", "--", ":", "-."]
    for name, values in history.items():
        for layer in range(values.shape[1]):
            label = f"{words['detectors'].get(name, name)} · " \
                    f"{words['layer_n'].format(n=layer + 1)}"
            ax_score.plot(steps, values[:, layer].max(axis=-1), styles[layer % 4],
                          color=colours.get(name, "#555753"), label=label, lw=1.2)
    ax_score.set_ylim(0, 1)
    ax_score.set_xlabel(words["step"])
    ax_score.set_ylabel(words["score"])
    ax_score.legend(fontsize=7, loc="center right")
    if phase_change_step is not None:
        for ax in (ax_loss, ax_score):
            ax.axvline(phase_change_step, color="#888a85", lw=0.8, ls="--")
        right = bool(steps) and phase_change_step > steps[-1] / 2
        ax_score.annotate(f"{words['phase_change']} " if right else f" {words['phase_change']}",
                          (phase_change_step, 0.97), fontsize=7, ha="right" if right else "left",
                          va="top", color="#555753")
    if title is not None:
        fig.suptitle(check_text(str(title), "title"), fontsize=10, parse_math=False)


def training_html(
    snapshots: Any,
    snapshot_steps: Sequence[int],
    tokens: Sequence[Any],
    *,
    head_history: Mapping[str, Any] | None = None,
    heldout_loss: Any = None,
    period: int | None = None,
    title: str | None = None,
    lang: Lang = "en",
) -> str:
    """The page: snapshots (K, L, H, T, T) at ``snapshot_steps`` (K,) on ``tokens`` (T,),
    a slider over the steps, a layer and a head to choose; -> str (HTML)."""
    check_lang(lang)
    words = TRAINING_WORDS[lang]
    w = np.asarray(snapshots, dtype=np.float64)
    if w.ndim != 5 or w.shape[-1] != w.shape[-2] or w.shape[0] == 0:
        raise ShapeError(f"snapshots: expected (K, L, H, T, T) with K >= 1, got "
                         f"{shape_str(w.shape)}")
    K, L, H, T, _ = w.shape
    if not np.isfinite(w).all():
        raise AttnlabError("snapshots: expected finite weights, got NaN or Inf")
    steps = [int(s) for s in snapshot_steps]
    if len(steps) != K:
        raise ShapeError(f"snapshot_steps: expected K = {K} steps, got {len(steps)}")
    labels = [check_text(str(t), f"tokens[{i}]") for i, t in enumerate(tokens)]
    if len(labels) != T:
        raise ShapeError(f"tokens: expected T = {T} labels, got {len(labels)}")
    history = _check_history(head_history or {}, K)
    losses = [None] * K if heldout_loss is None else [
        None if not math.isfinite(float(x)) else round(float(x), 5) for x in heldout_loss]
    if len(losses) != K:
        raise ShapeError(f"heldout_loss: expected K = {K} values, got {len(losses)}")
    if title is not None:
        check_text(str(title), "title")
    start = (0, 0)
    if "induction" in history and L > 1:  # open on the best layer-1+ induction head
        last = history["induction"][-1]  # (L, H)
        layer, head = np.unravel_index(int(np.argmax(last[1:])), last[1:].shape)
        start = (int(layer) + 1, int(head))
    payload = {
        "shape": [K, L, H, T],
        "steps": steps,
        "tokens": labels,
        "weights": np.rint(np.clip(w, 0.0, 1.0) * 1000).astype(int).tolist(),
        "head_scores": {name: np.round(v, 4).tolist() for name, v in history.items()},
        "heldout_loss": losses,
        "period": period,
        "start": list(start),
        "words": words,
    }
    css, js = _asset("training.css").strip(), _asset("training.js").strip()
    text = {key: html.escape(str(words[key])) for key in (
        "play", "hint", "heatmap", "scores")}
    return _asset("training.html").format(
        lang_attr="zh-CN" if lang == "zh" else "en",
        csp=page_csp(css, js),
        title=html.escape(str(title) if title is not None else words["title"]),
        css=css,
        js=js,
        data=script_json(payload),
        step_label=html.escape(words["step"]),
        layer_label=html.escape(words["layer"]),
        head_label=html.escape(words["head"]),
        **text,
    )


