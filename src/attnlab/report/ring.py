"""The virtual ring's report in words (English / 中文) and as a picture (ranks × steps).

:func:`attnlab.distributed.simulate` returns a :class:`~attnlab.distributed.RingReport`,
data only; this module renders it:

- :func:`ring_text`: who holds which positions, what each rank computes, receives and
  merges at every step, the work per rank and its imbalance, the bytes sent;
- :func:`ring_figure`: a ranks × steps grid coloured by the work in each cell (skipped
  cells blank), with each rank's total beside it, so the causal imbalance of the
  contiguous layout, and how zigzag and striped remove it, can be seen at a glance.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..distributed.simulate import RingReport, StepRecord
from .figures import new_figure
from .fonts import font_context
from .text import check_lang, display_width
from .words import Lang

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["RING_WORDS", "ring_figure", "ring_text"]

#: Every word of the ring report, in English and Chinese.
RING_WORDS: dict[str, dict[str, str]] = {
    "en": {
        "title": "Ring attention, simulated: W = {W} ranks, {layout} layout, {mask}, "
                 "T = {T} ({n} positions per rank)",
        "causal": "causal", "full": "no mask",
        "layout_contiguous": "contiguous: rank r holds one block of consecutive positions",
        "layout_zigzag": "zigzag: the sequence is cut into 2W chunks; rank r holds chunks r "
                         "and 2W−1−r, one early and one late",
        "layout_striped": "striped: rank r holds every W-th position, starting at r",
        "holds": "rank {r} holds positions {positions}",
        "steps": "At every step each rank computes its queries against the K/V shard it "
                 "holds, merges the partial result by log-sum-exp, then passes the shard "
                 "to the next rank:",
        "step": "step {s}",
        "computes": "rank {r} · K/V of rank {src} · {what}",
        "skipped": "skipped (the causal mask hides all of it)",
        "work": "{pairs:,} scores in {blocks}",
        "block_full": "a {rows}×{cols} block",
        "block_tri": "a {rows}×{cols} triangle",
        "moves": "; receives from rank {prev}, sends to rank {next}",
        "grid": "Scores computed per batch-head (rows: ranks, columns: steps; – = skipped):",
        "rank": "rank", "total": "total",
        "flops": "FLOPs per rank: {flops}",
        "imbalance": "work imbalance (max / min rank): {ratio}",
        "comm": "each rank sends W − 1 = {k} K/V shards of {size} = {total} in the forward",
        "figure": "Work per rank and step ({layout}, {mask}, W = {W})",
        "xlabel": "ring step", "ylabel": "rank", "bars": "total per rank",
    },
    "zh": {
        "title": "环形注意力（模拟）：W = {W} 个进程（rank），{layout} 布局，{mask}，"
                 "T = {T}（每个进程 {n} 个位置）",
        "causal": "因果掩码", "full": "无掩码",
        "layout_contiguous": "连续（contiguous）：进程 r 持有一段连续的位置",
        "layout_zigzag": "之字形（zigzag）：序列切成 2W 块，进程 r 持有第 r 块和第 2W−1−r 块，"
                         "一早一晚",
        "layout_striped": "条纹（striped）：进程 r 从位置 r 开始，每隔 W 个位置持有一个",
        "holds": "进程 {r} 持有位置 {positions}",
        "steps": "每一步，每个进程用自己的查询和手上的 K/V 分片计算，按 log-sum-exp "
                 "合并部分结果，然后把分片传给下一个进程：",
        "step": "第 {s} 步",
        "computes": "进程 {r} · 进程 {src} 的 K/V · {what}",
        "skipped": "跳过（因果掩码遮住了全部）",
        "work": "计算 {pairs:,} 个分数，{blocks}",
        "block_full": "{rows}×{cols} 的矩形块",
        "block_tri": "{rows}×{cols} 的三角块",
        "moves": "；从进程 {prev} 接收，发给进程 {next}",
        "grid": "每个批次·头计算的分数个数（行：进程，列：步；– = 跳过）：",
        "rank": "进程", "total": "合计",
        "flops": "每个进程的浮点运算量（FLOPs）：{flops}",
        "imbalance": "工作量不均衡度（最多 / 最少的进程）：{ratio}",
        "comm": "前向中每个进程发送 W − 1 = {k} 个 K/V 分片，每个 {size}，共 {total}",
        "figure": "每个进程每一步的工作量（{layout}，{mask}，W = {W}）",
        "xlabel": "环形步骤", "ylabel": "进程", "bars": "每个进程合计",
    },
}


def _bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _positions(pos: tuple[int, ...]) -> str:
    """Runs of consecutive positions as ranges; an even stride as "a, b, …, z"."""
    gaps = {b - a for a, b in zip(pos[:-1], pos[1:], strict=True)}
    if len(pos) > 2 and len(gaps) == 1 and pos[1] - pos[0] > 1:
        return f"{pos[0]}, {pos[1]}, …, {pos[-1]}"
    runs, start = [], pos[0] if pos else 0
    for a, b in zip(pos, (*pos[1:], None), strict=True):
        if b != a + 1:
            runs.append(f"{start}–{a}" if a != start else f"{a}")
            start = b if b is not None else 0
    return ", ".join(runs)


def _right(text: str, width: int) -> str:
    """``text`` right-aligned in ``width`` terminal columns (CJK characters take two)."""
    return " " * max(0, width - display_width(text)) + text


def _step_line(rec: StepRecord, words: dict[str, str], world_size: int) -> str:
    if not rec.blocks:
        what = words["skipped"]
    else:
        blocks = ", ".join(
            words["block_tri" if diagonal else "block_full"].format(
                rows=rows[1] - rows[0], cols=cols[1] - cols[0])
            for rows, cols, diagonal in rec.blocks)
        what = words["work"].format(pairs=rec.pairs, blocks=blocks)
    line = words["computes"].format(r=rec.rank, src=rec.kv_from, what=what)
    if rec.receives_from is not None and world_size > 1:
        line += words["moves"].format(prev=rec.receives_from, next=rec.sends_to)
    return line


def ring_text(report: RingReport, lang: Lang = "en", *, detail: bool = True) -> str:
    """The report as text in ``lang`` ("en" or "zh"); ``detail``: one line per rank and step."""
    words = RING_WORDS[check_lang(lang)]
    W, n = report.world_size, report.T // report.world_size
    mask = words["causal" if report.is_causal else "full"]
    lines = [words["title"].format(W=W, layout=report.layout, mask=mask, T=report.T, n=n),
             words[f"layout_{report.layout}"]]
    lines += ["  " + words["holds"].format(r=r, positions=_positions(pos))
              for r, pos in enumerate(report.positions)]
    if detail:
        lines += ["", words["steps"]]
        for s in range(W):
            lines.append("  " + words["step"].format(s=s))
            lines += ["    " + _step_line(report.steps[r][s], words, W) for r in range(W)]
    work = report.work()  # (W, W)
    width = max(7, len(f"{int(work.sum(axis=1).max()):,}") + 1)
    lines += ["", words["grid"]]
    width = max(width, max(display_width(words["step"].format(s=s)) + 1 for s in range(W)))
    header = "  " + _right(words["rank"], 6) + " " + "".join(
        _right(words["step"].format(s=s), width) for s in range(W)) + _right(
        words["total"], width + 2)
    lines.append(header)
    for r in range(W):
        cells = "".join(f"{(f'{c:,}' if c else '–'):>{width}}" for c in work[r])
        lines.append(f"  {r:>6} {cells}{int(work[r].sum()):>{width + 2},}")
    flops = report.flops_per_rank()
    ratio = report.imbalance()
    lines += ["", words["flops"].format(flops=", ".join(f"{int(f):,}" for f in flops)),
              words["imbalance"].format(ratio="∞" if np.isinf(ratio) else f"{ratio:.2f}"),
              words["comm"].format(k=W - 1, size=_bytes(report.kv_bytes),
                                   total=_bytes(report.sent_bytes_per_rank()))]
    return "\n".join(lines)


def ring_figure(report: RingReport, lang: Lang = "en") -> Figure:
    """Ranks × steps, each cell coloured and labelled by the scores computed (blank:
    skipped), with each rank's total as a bar on the right."""
    words = RING_WORDS[check_lang(lang)]
    W = report.world_size
    work = report.work().astype(float)  # (W, W)
    with font_context():
        fig = new_figure((2.2 + 0.9 * W + 2.2, 1.4 + 0.55 * W), feature="Drawing the ring")
        grid, bars = fig.subplots(1, 2, width_ratios=[max(W, 2), 2], sharey=True)
        shown = np.ma.masked_equal(work, 0.0)  # skipped cells stay blank
        image = grid.imshow(shown, cmap="Blues", vmin=0.0, vmax=max(work.max(), 1.0),
                            aspect="auto")
        for r in range(W):
            for s in range(W):
                value = int(work[r, s])
                grid.text(s, r, f"{value:,}" if value else "–", ha="center", va="center",
                          fontsize=8, color="white" if value > 0.6 * work.max() else "black")
        grid.set_xticks(range(W))
        grid.set_yticks(range(W))
        grid.set_xlabel(words["xlabel"])
        grid.set_ylabel(words["ylabel"])
        mask = words["causal" if report.is_causal else "full"]
        grid.set_title(words["figure"].format(layout=report.layout, mask=mask, W=W),
                       fontsize=9)
        totals = work.sum(axis=1)  # (W,)
        bars.barh(range(W), totals, color="#4a7fb5")
        bars.set_xlabel(words["bars"])
        bars.set_title(words["imbalance"].format(
            ratio="∞" if np.isinf(report.imbalance()) else f"{report.imbalance():.2f}"),
            fontsize=8)
        fig.colorbar(image, ax=grid, shrink=0.8)
    return fig
