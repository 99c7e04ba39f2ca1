"""``attnlab bench --roofline``'s results: a table (English or Chinese), JSON and a plot.

The words are keyed (``WORDS[lang][key]``), never translated from the English
output. :func:`format_roofline` is what the command prints; :func:`write_roofline`
writes roofline.json, roofline.txt and (with matplotlib) roofline.png.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..checks import make_folder
from ..report.figures import new_figure, save_figure
from ..report.fonts import font_context
from ..report.text import check_lang, display_width
from ..report.words import Lang
from .roofline import RooflineResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["WORDS", "format_roofline", "roofline_figure", "write_roofline"]

WORDS: dict[str, dict[str, str]] = {
    "en": {
        "title": "attnlab bench --roofline · {threads} thread(s) · {clock} · median of "
                 "{repeats} runs · {seconds:.1f} s · load average {load}",
        "wall": "wall time", "cpu": "CPU time",
        "peaks": "Peaks of this machine: sgemm {gemm:.1f} GFLOP/s · exp {exp:.2f} G/s · "
                 "memory bandwidth {bw:.1f} GB/s",
        "path": "path", "size": "size", "ms": "ms", "gflops": "GFLOP/s", "gbs": "GB/s",
        "limit": "limited by", "share": "share of bound",
        "sgemm": "sgemm", "exp": "exp", "memory": "memory",
        "note": "bound = the largest of FLOPs / sgemm peak, exps / exp rate and bytes / "
                "bandwidth; share = bound / measured time (1.00 = at the limit)",
        "x": "arithmetic intensity (FLOP per compulsory byte)",
        "y": "GFLOP/s",
        "plot": "Roofline: attention paths against this machine's peaks ({threads} thread(s))",
        "roof_gemm": "sgemm peak", "roof_memory": "memory bandwidth",
        "roof_exp": "exp ceiling at 4·D FLOPs per exp (D = {d})",
    },
    "zh": {
        "title": "attnlab bench --roofline · {threads} 个线程 · {clock} · {repeats} 次运行的"
                 "中位数 · {seconds:.1f} 秒 · 负载均值 {load}",
        "wall": "墙钟时间", "cpu": "CPU 时间",
        "peaks": "本机峰值：sgemm {gemm:.1f} GFLOP/s · exp {exp:.2f} G/s · "
                 "内存带宽 {bw:.1f} GB/s",
        "path": "路径", "size": "规模", "ms": "毫秒", "gflops": "GFLOP/s", "gbs": "GB/s",
        "limit": "受限于", "share": "占上限比例",
        "sgemm": "sgemm", "exp": "exp", "memory": "内存",
        "note": "上限 = FLOPs / sgemm 峰值、exp 次数 / exp 速率、字节数 / 带宽 三者中最大者；"
                "比例 = 上限 / 实测时间（1.00 即达到上限）",
        "x": "算术强度（每个必需字节的 FLOP 数）",
        "y": "GFLOP/s",
        "plot": "Roofline：各注意力路径与本机峰值（{threads} 个线程）",
        "roof_gemm": "sgemm 峰值", "roof_memory": "内存带宽",
        "roof_exp": "exp 上限：每次 exp 对应 4·D 个 FLOP（D = {d}）",
    },
}


def _pad(text: str, width: int) -> str:
    return text + " " * max(width - display_width(text), 0)


def format_roofline(result: RooflineResult, lang: Lang = "en") -> str:
    """The peaks and one row per path, in ``lang``."""
    words = WORDS[check_lang(lang)]
    cfg, peaks = result.config, result.peaks
    load = "—" if result.load_average is None else " ".join(
        f"{x:.2f}" for x in result.load_average)
    lines = [
        words["title"].format(threads=cfg.threads, repeats=cfg.repeats,
                              clock=words["cpu" if cfg.cpu_time else "wall"],
                              seconds=result.seconds, load=load),
        words["peaks"].format(gemm=peaks.gemm_gflops, exp=peaks.exp_per_second / 1e9,
                              bw=peaks.bandwidth_gbs),
        "",
    ]
    header = [words[key] for key in ("path", "size", "ms", "gflops", "gbs", "limit", "share")]
    rows = [[p.name, p.size, f"{p.seconds * 1e3:.2f}", f"{p.gflops:.1f}", f"{p.gbs:.2f}",
             words[p.limit], f"{p.share:.2f}"] for p in result.paths]
    widths = [max(display_width(row[i]) for row in [header, *rows]) + 2
              for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("".join(_pad(cell, width) for cell, width in zip(row, widths, strict=True))
                     .rstrip())
    lines += ["", words["note"]]
    return "\n".join(lines)


def roofline_figure(result: RooflineResult, lang: Lang = "en") -> Figure:
    """Log-log: each path at (FLOPs per byte, GFLOP/s), under the sgemm roof, the
    bandwidth slope and the exp ceiling of a forward pass."""
    with font_context():  # a CJK font for the Chinese words, where one is installed
        return _roofline_figure(result, WORDS[check_lang(lang)])


def _roofline_figure(result: RooflineResult, words: dict[str, str]) -> Figure:
    peaks = result.peaks
    fig = new_figure((7.0, 4.6), feature="attnlab bench --roofline's plot")
    ax = fig.add_subplot()
    xs = [p.intensity for p in result.paths]
    low, high = min(xs + [0.1]) / 2, max(xs + [1000.0]) * 2
    ridge = peaks.gemm_gflops / peaks.bandwidth_gbs
    ax.plot([low, ridge, high], [low * peaks.bandwidth_gbs, peaks.gemm_gflops,
                                 peaks.gemm_gflops], color="black", label=words["roof_gemm"])
    ax.plot([low, ridge], [low * peaks.bandwidth_gbs, peaks.gemm_gflops], color="tab:blue",
            label=words["roof_memory"])
    d = result.config.head_dim
    ax.axhline(peaks.exp_per_second * 4 * d / 1e9, color="tab:red", linestyle="--",
               label=words["roof_exp"].format(d=d))
    for p in result.paths:
        ax.plot(p.intensity, p.gflops, marker="o", linestyle="none")
        ax.annotate(f"{p.name} ({p.share:.2f})", (p.intensity, p.gflops), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(words["x"])
    ax.set_ylabel(words["y"])
    ax.set_title(words["plot"].format(threads=result.config.threads), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def write_roofline(result: RooflineResult, out_dir: str | os.PathLike[str], *,
                   plots: bool = True, lang: Lang = "en") -> list[Path]:
    """Write roofline.json, roofline.txt (in ``lang``) and, with ``plots``, roofline.png
    into ``out_dir``; returns the paths written."""
    out = make_folder(out_dir, "out_dir")
    json_path = out / "roofline.json"
    json_path.write_text(result.to_json() + "\n", encoding="utf-8")
    table_path = out / "roofline.txt"
    table_path.write_text(format_roofline(result, lang) + "\n", encoding="utf-8")
    written = [json_path, table_path]
    if plots:
        written.append(save_figure(roofline_figure(result, lang), out / "roofline.png"))
    return written
