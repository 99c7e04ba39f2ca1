"""The approximation study's results in words, tables and plots.

:func:`summarize` states, per method, where it is worse than exact attention (error,
time, memory) with the numbers; :func:`format_table` is what ``attnlab approx``
prints; :func:`save_study` writes approx.json and the PNG plots.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..checks import make_folder
from ..fast.block_sparse import block_sparse_mask
from ..fast.sparse import sliding_window_mask
from ..messages import Listing, Message, msg, render
from ..report.figures import new_figure, save_figure
from ..report.fonts import font_context
from ..report.heatmaps import plot_attention
from ..report.text import check_lang, display_width
from ..report.words import Lang
from .approx_methods import METHODS

__all__ = ["format_table", "save_study", "summarize"]


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _sentences(says: list[Message], lang: Lang) -> str:
    """English sentences are separated by a space, Chinese ones follow each other."""
    return ("" if lang == "zh" else " ").join(m.render(lang) for m in says)


def summarize(records: list[dict[str, Any]], inputs: list[dict[str, Any]],
              long_result: dict[str, Any] | None = None, *,
              lang: Lang = "en") -> dict[str, dict[str, Any]]:
    """Per method: where it is worse than exact attention (error, time, memory), in numbers;
    the statement in ``lang``.

    Returns {method: {"statement": str, "worst_error": {...}, "worse_than_mean_v":
    [...], "slower": [...], "more_memory": [...], "faster_from_T": {knob value:
    T or None}}}. "worse_than_mean_v" lists the runs whose error exceeds that of
    outputting the mean of V for every query (the input's ``mean_v_error``).
    """
    exact = {(r["input"], r["T"]): r for r in records if r["method"] == "exact"}
    floor = {(i["input"], i["T"]): i["mean_v_error"] for i in inputs}
    out: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        rows = [r for r in records if r["method"] == method.name]
        if not rows:
            continue
        worst = max(rows, key=lambda r: r["rel_error"])
        by_input: dict[str, list[float]] = {}
        for r in rows:
            by_input.setdefault(r["input"], []).append(r["rel_error"])
        useless = [r for r in rows if r["rel_error"] > floor.get((r["input"], r["T"]), math.inf)]
        slower = [r for r in rows if r["time_vs_exact"] > 1.0]
        heavier = [r for r in rows if r["memory_vs_exact"] > 1.0]
        # Break-even lengths on the Gaussian inputs (one shape: B = 1, D as configured);
        # MiniLM's inputs (72 heads, D = 32) are a different workload.
        gaussian = [r for r in rows if r["input"].startswith("gaussian")]
        faster_from: dict[str, int | None] = {}
        for value in sorted({r["value"] for r in gaussian}):
            lengths = sorted({r["T"] for r in gaussian if r["value"] == value})
            winning = [T for T in lengths if all(r["time_vs_exact"] < 1.0 for r in gaussian
                                                 if r["value"] == value and r["T"] == T)]
            # the smallest T from which every measured longer T is also faster
            first = next((T for i, T in enumerate(lengths)
                          if all(t in winning for t in lengths[i:])), None)
            faster_from[str(value)] = first

        knob = method.knob
        says = [msg("approx.says.label", label=msg(f"approx.method.{method.name}"))]
        says.append(msg(
            "approx.says.error_sparse" if method.kind == "sparse" else "approx.says.error",
            ranges=Listing([f"{name} {min(errs):.2g}–{max(errs):.2g}"
                          for name, errs in by_input.items()]),
            worst=f"{worst['rel_error']:.3g}", input=worst["input"], T=worst["T"], knob=knob,
            value=worst["value"]))
        if useless:
            says.append(msg(
                "approx.says.worse_than_mean", count=len(useless), total=len(rows),
                detail=Listing([msg("approx.says.count_of", input=name,
                                  count=sum(r["input"] == name for r in useless),
                                  total=sum(r["input"] == name for r in rows))
                              for name in by_input
                              if any(r["input"] == name for r in useless)])))
        if slower:
            slowest = max(slower, key=lambda r: r["time_vs_exact"])
            cases = sorted({(r["T"], r["value"]) for r in slower})
            says.append(msg(
                "approx.says.slower", count=len(cases),
                total=len({(r["T"], r["value"]) for r in rows}), knob=knob,
                ratio=f"{slowest['time_vs_exact']:.3g}", time=_fmt_ms(slowest["time_s"]),
                exact_time=_fmt_ms(exact[(slowest["input"], slowest["T"])]["time_s"]),
                input=slowest["input"], T=slowest["T"], value=slowest["value"]))
        else:
            says.append(msg("approx.says.never_slower"))
        never = [v for v, T in faster_from.items() if T is None]
        wins = [msg("approx.says.win", knob=knob, value=v, T=T)
                for v, T in faster_from.items() if T is not None]
        if wins:
            says.append(msg("approx.says.faster_from", wins=Listing(wins, comma=True)))
        if never:
            says.append(msg("approx.says.never_faster", knob=knob,
                            values=Listing(never, comma=True)))
        if heavier:
            heaviest = max(heavier, key=lambda r: r["memory_vs_exact"])
            says.append(msg(
                "approx.says.more_memory", count=len(heavier), total=len(rows),
                ratio=f"{heaviest['memory_vs_exact']:.3g}",
                mib=f"{heaviest['peak_bytes'] / 2**20:.3g}", input=heaviest["input"],
                T=heaviest["T"], knob=knob, value=heaviest["value"]))
        if long_result is not None:
            for row in long_result["methods"]:
                if row["method"] == method.name:
                    says.append(msg(
                        "approx.says.long", T=long_result["T"], knob=row["knob"],
                        value=row["value"], speedup=f"{row['speedup_vs_dense']:.3g}",
                        time=_fmt_ms(row["time_s"]),
                        dense_time=_fmt_ms(long_result["dense"]["time_s"]),
                        memory=f"{row['memory_vs_dense']:.2g}",
                        error=f"{row['rel_error_vs_dense']:.2g}"))
        out[method.name] = {
            "statement": _sentences(says, lang),
            "worst_error": {k: worst[k] for k in ("input", "T", "value", "rel_error")},
            "worse_than_mean_v": [{k: r[k] for k in ("input", "T", "value", "rel_error")}
                                  for r in useless],
            "slower": [{k: r[k] for k in ("input", "T", "value", "time_vs_exact")}
                       for r in slower],
            "more_memory": [{k: r[k] for k in ("input", "T", "value", "memory_vs_exact")}
                            for r in heavier],
            "faster_from_T": faster_from,
        }
    return out


def format_table(result: dict[str, Any], lang: Lang = "en") -> str:
    """The records as an aligned text table, then the long-sequence check and the summary,
    in ``lang``."""
    lang = check_lang(lang)
    header = (render("approx.col.input", lang), "T", render("approx.col.method", lang),
              render("approx.col.knob", lang), render("approx.col.error", lang),
              render("study.time", lang), render("approx.col.vs_exact", lang),
              render("approx.col.peak", lang), render("approx.col.vs_exact", lang))
    rows = [header]
    for r in result["records"]:
        knob = "" if r["knob"] is None else f"{r['knob']}={r['value']}"
        rows.append((r["input"], str(r["T"]), r["method"], knob, f"{r['rel_error']:.3g}",
                     _fmt_ms(r["time_s"]), f"{r['time_vs_exact']:.2f}",
                     f"{r['peak_bytes'] / 2**20:.3g}", f"{r['memory_vs_exact']:.2f}"))
    widths = [max(display_width(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(_pad(cell, w, right=i >= 4)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append(render("approx.inputs", lang, inputs=Listing([
        msg("approx.input", input=i["input"], T=i["T"], max_weight=f"{i['mean_max_weight']:.3g}",
            entropy=f"{i['normalised_entropy']:.3g}", mean_v=f"{i['mean_v_error']:.3g}")
        for i in result["inputs"]])))
    long_result = result.get("long_sequence")
    if long_result:
        dense = long_result["dense"]
        lines.append("")
        lines.append(render("approx.long", lang, T=long_result["T"], D=long_result["D"],
                            time=_fmt_ms(dense["time_s"]),
                            peak=f"{dense['peak_bytes'] / 2**20:.4g}"))
        for row in long_result["methods"]:
            lines.append(render("approx.long_method", lang, method=row["method"],
                                knob=row["knob"], value=row["value"],
                                time=_fmt_ms(row["time_s"]),
                                speedup=f"{row['speedup_vs_dense']:.3g}",
                                peak=f"{row['peak_bytes'] / 2**20:.3g}",
                                error=f"{row['rel_error_vs_dense']:.2g}"))
        target = long_result["target"]
        lines.append(render("approx.target_met" if target["met"] else "approx.target_missed",
                            lang, W=target["W"], required=f"{target['required_speedup']:g}",
                            speedup=f"{target['speedup']:.3g}"))
    lines.append("")
    lines.append(render("approx.where_worse", lang))
    summary = result["summary"] if lang == "en" else summarize(
        result["records"], result["inputs"], long_result, lang=lang)
    for entry in summary.values():
        lines.append("- " + entry["statement"])
    return "\n".join(lines)


def _pad(text: str, width: int, *, right: bool = False) -> str:
    """``text`` padded to ``width`` columns of the terminal (a CJK character takes two)."""
    fill = " " * max(width - display_width(text), 0)
    return fill + text if right else text + fill


# ------------------------------------------------------------------------ saving


def _figure(ncols: int, width: float = 5.0, height: float = 4.2) -> Any:
    fig = new_figure((width * ncols, height), feature="attnlab approx plots")
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


_COLOURS = {"exact": "black", "sliding_window": "tab:blue", "block_sparse": "tab:cyan",
            "linformer": "tab:red", "linformer_pool": "tab:orange",
            "nystrom": "tab:green", "performer": "tab:purple"}
_MARKERS = "osD^v<>p*h"


def _plot_error_vs_cost(result: dict[str, Any], cost: str, label: str, lang: Lang) -> Any:
    from matplotlib.ticker import NullFormatter

    records = [r for r in result["records"] if r["method"] != "exact"]
    names = list(dict.fromkeys(r["input"] for r in result["records"]))
    lengths = sorted({r["T"] for r in result["records"]})
    fig, axes = _figure(max(1, len(names)))
    for ax, name in zip(axes, names, strict=False):  # no input: one empty panel
        for method in METHODS:
            rows = [r for r in records if r["input"] == name and r["method"] == method.name]
            for r in rows:
                ax.scatter(r[cost], max(r["rel_error"], 1e-8), color=_COLOURS[method.name],
                           marker=_MARKERS[lengths.index(r["T"]) % len(_MARKERS)], s=36,
                           label=method.name if r is rows[0] else None)
                ax.annotate(f"{r['knob']}={r['value']}", (r[cost], max(r["rel_error"], 1e-8)),
                            fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
        floors = [i["mean_v_error"] for i in result["inputs"] if i["input"] == name]
        for floor in floors:
            ax.axhline(floor, color="grey", linestyle=":", linewidth=0.8,
                       label=render("approx.plot.mean_v", lang) if floor == floors[0] else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # short log ranges: no clutter
        ax.set_title(name)
        ax.set_xlabel(render("approx.plot.cost", lang, cost=msg(label)))
        ax.set_ylabel(render("approx.plot.error", lang))
        ax.grid(True, which="major", alpha=0.3)
    markers = Listing([f"{_MARKERS[i % len(_MARKERS)]} {T}" for i, T in enumerate(lengths)],
                      comma=True)
    axes[0].legend(fontsize=7, title=render("approx.plot.markers", lang, markers=markers),
                   title_fontsize=7)
    return fig


def _plot_time_vs_length(result: dict[str, Any], lang: Lang) -> Any:
    from matplotlib.ticker import NullFormatter

    names = list(dict.fromkeys(r["input"] for r in result["records"]))
    fig, axes = _figure(max(1, len(names)))
    for ax, name in zip(axes, names, strict=False):  # no input: one empty panel
        rows = [r for r in result["records"] if r["input"] == name]
        for key in dict.fromkeys((r["method"], r["value"]) for r in rows):
            line = sorted((r["T"], r["time_s"]) for r in rows if (r["method"], r["value"]) == key)
            method, value = key
            ax.plot([t for t, _ in line], [s * 1e3 for _, s in line], marker="o", markersize=3,
                    color=_COLOURS[method], linewidth=2.5 if method == "exact" else 1,
                    label=method if value is None else f"{method} {value}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        lengths = sorted({r["T"] for r in rows})
        ax.set_xticks(lengths, [str(t) for t in lengths])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(name)
        ax.set_xlabel(render("approx.plot.tokens", lang))
        ax.set_ylabel(render("approx.plot.time_ms", lang))
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=6, ncol=2)
    return fig


def _plot_patterns(lang: Lang) -> Any:
    fig, axes = _figure(3, width=4.6, height=4.4)
    patterns = [
        (render("approx.plot.window_causal", lang, W=9),
         sliding_window_mask(64, 9, is_causal=True)),
        (render("approx.plot.window_global", lang, W=9),
         sliding_window_mask(64, 9, is_causal=False, global_tokens=[0])),
        (render("approx.plot.bigbird", lang, b=4), block_sparse_mask(64, 4)),
    ]
    for ax, (title, mask) in zip(axes, patterns, strict=True):
        plot_attention(mask.astype(float), ax=ax, title=title, annotate=False, lang=lang)
    return fig


def save_study(result: dict[str, Any], out_dir: str | Path, *, lang: Lang = "en") -> list[Path]:
    """Write approx.json and the PNG plots into ``out_dir``; return the paths.

    - approx.json: the whole result;
    - error_vs_time.png, error_vs_memory.png: error against cost relative to exact
      attention, one panel per input;
    - time_vs_length.png: time against T for every method and knob;
    - patterns.png: the sparse masks, to see what the sparse methods keep.

    ``lang="zh"``: the plots' words in Chinese.
    """
    folder = make_folder(out_dir, "out_dir")
    json_path = folder / "approx.json"
    json_path.write_text(json.dumps(_finite(result), indent=2) + "\n", encoding="utf-8")
    written = [json_path]
    lang = check_lang(lang)
    with font_context():  # a CJK font for the Chinese words, where one is installed
        figures = [
            ("error_vs_time.png",
             _plot_error_vs_cost(result, "time_vs_exact", "approx.plot.time", lang)),
            ("error_vs_memory.png",
             _plot_error_vs_cost(result, "memory_vs_exact", "approx.plot.memory", lang)),
            ("time_vs_length.png", _plot_time_vs_length(result, lang)),
            ("patterns.png", _plot_patterns(lang)),
        ]
    for name, fig in figures:
        written.append(save_figure(fig, folder / name))
    return written


def _finite(value: Any) -> Any:
    """JSON has no inf/NaN: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
