"""``attnlab bench``'s results as plain-text tables, PNG plots and files.

:func:`format_table` is what the command prints; :func:`write_report` writes
results.json, table.txt and (with matplotlib) throughput.png, memory.png,
decode_latency.png and generate.png.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..checks import make_folder
from ..messages import Message, msg, render
from ..report.figures import new_figure, save_figure
from ..report.fonts import font_context
from ..report.text import check_lang, display_width
from ..report.words import Lang
from .bench_results import BenchResult, GenerateRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["format_table", "write_report"]


def _figure(figsize: tuple[float, float] = (6.4, 4.2)) -> Figure:
    return new_figure(figsize, feature="attnlab bench plots")


def _mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f}"


def _spread(value: float, low: float, high: float, digits: int) -> str:
    return f"{value:.{digits}f} [{low:.{digits}f}–{high:.{digits}f}]"


def _count(key: str, n: int) -> Message:
    """``key.one`` or ``key.many``, by ``n``."""
    return msg(f"{key}.{'one' if n == 1 else 'many'}", n=n)


def _pad(text: str, width: int) -> str:
    """``text`` padded to ``width`` terminal columns (a CJK character takes two)."""
    return text + " " * max(width - display_width(text), 0)


def format_table(result: BenchResult, lang: Lang = "en") -> str:
    """The results as plain-text tables in ``lang`` (what ``attnlab bench`` prints)."""
    lang = check_lang(lang)
    cfg = result.config
    lines = [render("bench.title", lang, threads=_count("study.threads", cfg.threads),
                    median=_count("study.median_runs", cfg.repeats),
                    seconds=f"{result.seconds:.1f}")]
    if result.attention:
        names = list(cfg.contenders)
        width = 22
        lines += [
            "",
            render("bench.throughput", lang, dtype=cfg.dtype, B=cfg.batch, H=cfg.heads,
                   D=cfg.head_dim, mask=msg("bench.causal" if cfg.causal else "bench.no_mask"),
                   formula=f"4·B·H·T·S·D{' / 2' if cfg.causal else ''}"),
            ("T=S".ljust(7) + "".join(n.ljust(width) for n in names)).rstrip(),
        ]
        mem_rows = []
        for T in cfg.lengths:
            rows = {r.contender: r for r in result.attention if r.T == T}
            cells, mem_cells = [], []
            for n in names:
                r = rows[n]
                if r.timing is None:
                    cells.append(("n/a" if r.error is None else r.error.split(":")[0]).ljust(width))
                    mem_cells.append("—".ljust(width))
                    continue
                t = r.timing
                cells.append(_spread(r.flops / t.median / 1e9, r.flops / t.max / 1e9,
                                     r.flops / t.min / 1e9, 1).ljust(width))
                mem = _mib(r.peak_bytes)
                if r.memory_method == "tracemalloc" and r.rss_peak_bytes is not None:
                    mem += render("bench.rss", lang, mib=_mib(r.rss_peak_bytes))
                mem_cells.append(_pad(mem, width))
            lines.append(str(T).ljust(7) + "".join(cells).rstrip())
            mem_rows.append(str(T).ljust(7) + "".join(mem_cells).rstrip())
        lines += ["", render("bench.memory", lang),
                  ("T=S".ljust(7) + "".join(n.ljust(width) for n in names)).rstrip()]
        lines += mem_rows
        notes = sorted({f"{r.contender}: {r.error}" for r in result.attention if r.error})
        lines += [render("study.note", lang, text=n) for n in notes]
    if result.decode:
        m = cfg.model
        lines += [
            "",
            render("bench.decode", lang, E=m.d_model, H=m.num_heads, L=m.num_layers,
                   V=m.vocab_size, dtype=m.dtype),
            _pad(render("bench.col.context", lang), 9) + _pad(render("bench.col.cached", lang), 24)
            + _pad(render("bench.col.uncached", lang), 26)
            + _pad(render("bench.col.speedup", lang), 10)
            + render("bench.col.attend", lang, H=cfg.heads, D=cfg.head_dim),
        ]
        for d in result.decode:
            c, u, a = d.cached, d.uncached, d.attend
            lines.append(
                str(d.context).ljust(9)
                + _spread(c.median * 1e3, c.min * 1e3, c.max * 1e3, 2).ljust(24)
                + _spread(u.median * 1e3, u.min * 1e3, u.max * 1e3, 1).ljust(26)
                + f"{u.median / c.median:.1f}×".ljust(10)
                + _spread(a.median * 1e3, a.min * 1e3, a.max * 1e3, 3)
            )
        fit = result.decode_fit()
        if fit is not None:
            fit_names = {"cached": render("bench.col.cached", lang),
                         "uncached": render("bench.col.uncached", lang), "attend": "attend"}
            for name, shown in fit_names.items():
                f = fit[name]
                lines.append(render(
                    "bench.fit", lang, name=shown, intercept=f"{f['intercept_s'] * 1e3:.3f}",
                    slope=f"{f['seconds_per_context_token'] * 1e6:.3f}",
                    r2=f"{f['r2_linear']:.3f}", exponent=f"{f['loglog_exponent']:.2f}"))
    g = result.generate
    if g is not None:
        lines += [
            "",
            render("bench.generate", lang, new=g.new_tokens, prompt=g.prompt_len,
                   median=_count("study.median_runs", cfg.generate_repeats)),
            render("bench.generate_cached", lang,
                   spread=_spread(g.cached.median, g.cached.min, g.cached.max, 2)),
            render("bench.generate_uncached", lang,
                   spread=_spread(g.uncached.median, g.uncached.min, g.uncached.max, 2)),
            render("bench.same_tokens" if g.same_tokens else "bench.other_tokens", lang,
                   speedup=f"{g.speedup:.1f}", diff=f"{g.max_abs_logit_diff:.1e}"),
        ]
    return "\n".join(lines)


def _attention_plot(result: BenchResult, what: str, lang: Lang) -> Figure:
    cfg = result.config
    fig = _figure()
    ax = fig.add_subplot()
    for name in cfg.contenders:
        rows = [r for r in result.attention if r.contender == name and r.timing is not None]
        if what == "memory":
            rows = [r for r in rows if r.peak_bytes is not None]
        if not rows:
            continue
        xs = [r.T for r in rows]
        if what == "throughput":
            timings = [r.timing for r in rows if r.timing is not None]
            ys = [r.flops / t.median / 1e9 for r, t in zip(rows, timings, strict=True)]
            low = [y - r.flops / t.max / 1e9 for y, r, t in zip(ys, rows, timings, strict=True)]
            high = [r.flops / t.min / 1e9 - y for y, r, t in zip(ys, rows, timings, strict=True)]
            ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=name)
        else:
            ax.plot(xs, [max(r.peak_bytes or 0, 1) / 2**20 for r in rows], marker="o",
                    label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(render("bench.plot.length", lang))
    if what == "throughput":
        ax.set_ylabel(render("bench.plot.gflops", lang))
        ax.set_title(render("bench.plot.throughput", lang, dtype=cfg.dtype, H=cfg.heads,
                            D=cfg.head_dim, threads=_count("study.threads", cfg.threads)))
    else:
        ax.set_yscale("log")
        ax.set_ylabel(render("bench.plot.peak", lang))
        ax.set_title(render("bench.plot.memory", lang))
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def _decode_plot(result: BenchResult, lang: Lang) -> Figure:
    fig = _figure()
    ax = fig.add_subplot()
    xs = [r.context for r in result.decode]
    labels = {"cached": render("bench.plot.step_cached", lang),
              "uncached": render("bench.plot.step_uncached", lang),
              "attend": render("bench.col.attend", lang, H=result.config.heads,
                               D=result.config.head_dim)}
    for name, label in labels.items():
        ys = [getattr(r, name).median * 1e3 for r in result.decode]
        low = [y - getattr(r, name).min * 1e3 for y, r in zip(ys, result.decode, strict=True)]
        high = [getattr(r, name).max * 1e3 - y for y, r in zip(ys, result.decode, strict=True)]
        ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(render("bench.plot.context", lang))
    ax.set_ylabel(render("bench.plot.latency", lang))
    ax.set_title(render("bench.plot.decode", lang))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return fig


def _generate_plot(g: GenerateRecord, lang: Lang) -> Figure:
    fig = _figure((5.0, 3.6))
    ax = fig.add_subplot()
    labels = [render("bench.plot.kv_cache", lang), render("bench.plot.recompute", lang)]
    medians = [g.cached.median, g.uncached.median]
    errors = [[g.cached.median - g.cached.min, g.uncached.median - g.uncached.min],
              [g.cached.max - g.cached.median, g.uncached.max - g.uncached.median]]
    ax.bar(labels, medians, yerr=errors, capsize=4, color=["tab:green", "tab:red"])
    ax.set_ylabel(render("bench.plot.seconds", lang))
    ax.set_title(render("bench.plot.generate", lang, new=g.new_tokens, prompt=g.prompt_len,
                        speedup=f"{g.speedup:.1f}"))
    return fig


def write_report(result: BenchResult, out_dir: str | os.PathLike[str], *, plots: bool = True,
                 lang: Lang = "en") -> list[Path]:
    """Write results.json, table.txt and (with ``plots``) the PNG figures into ``out_dir``;
    ``lang="zh"``: the table and plots in Chinese.

    Returns the paths written.
    """
    lang = check_lang(lang)
    out = make_folder(out_dir, "out_dir")
    written = []
    json_path = out / "results.json"
    json_path.write_text(result.to_json() + "\n", encoding="utf-8")
    table_path = out / "table.txt"
    table_path.write_text(format_table(result, lang) + "\n", encoding="utf-8")
    written += [json_path, table_path]
    if plots:
        figures: list[tuple[str, Figure]] = []
        with font_context():  # a CJK font for the Chinese words, where one is installed
            if any(r.timing is not None for r in result.attention):
                figures.append(("throughput.png", _attention_plot(result, "throughput", lang)))
                if any(r.peak_bytes is not None for r in result.attention):
                    figures.append(("memory.png", _attention_plot(result, "memory", lang)))
            if result.decode:
                figures.append(("decode_latency.png", _decode_plot(result, lang)))
            if result.generate is not None:
                figures.append(("generate.png", _generate_plot(result.generate, lang)))
        for name, fig in figures:
            written.append(save_figure(fig, out / name))
    return written
