# ruff: noqa: E501  (a message catalog: a Chinese sentence reads best on one line)
"""Chinese for the studies' tables, notes and plots (``profile``, ``approx``, ``bench``).

Their English text is made from templates in the studies layer; this module is the
message catalog that turns each template's output into Chinese: a list of
(pattern, replacement) pairs, the most specific first, applied to a whole output
(:func:`localize`) or to every text of a figure (:func:`localize_figure`). Names stay
as they are (method and contender names, Q, K, V, softmax, units, numbers).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from .text import check_lang
from .words import Lang

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ZH_PATTERNS", "localize", "localize_figure"]

_N = r"[-\d.,e+×µ]+"

#: (English pattern, Chinese replacement), applied in order. Sentences and table
#: headings of ``attnlab profile``, ``approx`` and ``bench`` and their plots.
ZH_PATTERNS: list[tuple[str, str | Callable[[re.Match[str]], str]]] = [
    # ---- profile
    (r"attnlab profile · batch (\d+) · (\w+) · (\d+) BLAS threads? · median of (\d+) runs? · "
     r"T = ", r"attnlab profile · 批大小 \1 · \2 · \3 个 BLAS 线程 · \4 次运行的中位数 · T = "),
    (r"MiniLM-L6 \(all-MiniLM-L6-v2, pretrained\)", "MiniLM-L6（all-MiniLM-L6-v2，预训练）"),
    (r"BERT-base shape \(random weights\)", "BERT-base 规模（随机权重）"),
    (r"tiny BERT \(random weights\)", "微型 BERT（随机权重）"),
    (r"real weights; token ids drawn at random \(cost does not depend on the text\)",
     "真实权重；词元 id 随机抽取（计算量与文本内容无关）"),
    (r"random N\(0, 0\.02²\) weights built from attnlab blocks; position table of (\d+) rows",
     r"由 attnlab 模块构建、权重为随机 N(0, 0.02²)；位置表共 \1 行"),
    (r"position table has (\d+) rows; for T > \d+ it is tiled \(row p reads row p mod \d+\): "
     r"same cost, not a trained model",
     r"位置表只有 \1 行；T 更大时循环使用（第 p 行读取第 p mod \1 行）：计算量相同，但不是训练过的模型"),
    (r"  note: ", "  说明："),
    (r"│ attention   \(core\) │    FFN    rest │ total", "│   注意力      (核心) │ 前馈网络  其余 │ 合计"),
    (r"(\s)time  ", r"\1时间  "), (r"(\s)FLOPs (\s)", r"\1FLOPs\2"),
    (r"\(plain forward ([\d.,]+ ms)\)", r"（不计时的前向 \1）"),
    (r"time: the blocks' own modules, timed through hooks \(the attention call as one; its "
     r"parts in FLOPs\)", "时间：通过钩子对各模块计时（注意力调用整体计时；其内部各部分按 FLOPs 划分）"),
    (r"FLOPs per layer: attention = ", "每层 FLOPs：注意力 = "),
    (r";  FFN = ", "；前馈网络 = "),
    (r"attention's T² part \(QKᵀ, softmax, ·V\) overtakes the FFN at ",
     "注意力中与 T² 成正比的部分（QKᵀ、softmax、·V）超过前馈网络的位置："),
    (r"; with the projections at T = ", "；连同投影一起算时 T = "),
    (r"attention is 60% of FLOPs from T = (\S+) \(with projections\), T = (\S+) \(core alone\)",
     r"注意力占 FLOPs 60% 的起点：T = \1（含投影），T = \2（仅核心）"),
    (r"lines: FLOP share \(formula\) · dots: measured share of wall time · dotted: 60% and the "
     r"T where QKᵀ\+softmax\+·V overtakes the FFN",
     "实线：FLOPs 占比（公式）· 圆点：实测的时间占比 · 点线：60%，以及 QKᵀ+softmax+·V 超过前馈网络的 T"),
    (r"attention \(with projections\), FLOPs", "注意力（含投影），FLOPs"),
    (r"attention \(with projections\), time", "注意力（含投影），时间"),
    (r"attention core \(QKᵀ, softmax, ·V\), FLOPs", "注意力核心（QKᵀ、softmax、·V），FLOPs"),
    (r"feed-forward, FLOPs", "前馈网络，FLOPs"), (r"feed-forward, time", "前馈网络，时间"),
    (r"rest, FLOPs", "其余，FLOPs"), (r"rest, time", "其余，时间"),
    (r"sequence length T = S", "序列长度 T = S"), (r"sequence length T", "序列长度 T"),
    (r"share of the forward pass", "占前向计算的比例"),
    # ---- approx
    (r"rel\.error", "相对误差"), (r"peak MiB", "峰值 MiB"), (r"×exact", "×精确"),
    (r"^input(\s+)T(\s+)method(\s+)knob", r"输入\1  T\2方法\3参数"),
    (r"inputs \(exact attention\): ", "输入（精确注意力）："),
    (r"mean max weight", "平均最大权重"), (r"entropy/log T", "熵/log T"),
    (r"error of outputting mean\(V\)", "直接输出 mean(V) 的误差"),
    (r"long sequence T=(\d+) D=(\d+) float32, causal: dense (\S+ \S+), peak (\S+) MiB",
     r"长序列 T=\1 D=\2 float32，因果：稠密注意力 \3，峰值 \4 MiB"),
    (r"\((\S+)× faster\), peak (\S+) MiB, error vs dense (\S+)",
     r"（快 \1 倍），峰值 \2 MiB，与稠密注意力的误差 \3"),
    (r"target W=(\d+) ≥ (\S+)× faster: met", r"目标 W=\1 快 ≥ \2 倍：已达到"),
    (r"target W=(\d+) ≥ (\S+)× faster: NOT met", r"目标 W=\1 快 ≥ \2 倍：未达到"),
    (r"Where each method is worse than exact attention:", "各方法不如精确注意力之处："),
    (r"sliding window \(symmetric, W keys\)", "滑动窗口（对称，W 个键）"),
    (r"block-sparse \(BigBird: 3 local, 1 global, 2 random blocks of b\)",
     "块稀疏（BigBird：3 个局部块、1 个全局块、2 个随机块，块大小 b）"),
    (r"Linformer \(random Gaussian E, F to k rows, untrained\)",
     "Linformer（随机高斯 E、F 投影到 k 行，未训练）"),
    (r"Linformer with mean pooling to k rows \(E = F = segment means\)",
     "Linformer 均值池化到 k 行（E = F = 分段均值）"),
    (r"Nyström \(m segment-mean landmarks, 6-step pseudo-inverse\)",
     "Nyström（m 个分段均值地标，6 步伪逆）"),
    (r"Performer FAVOR\+ \(M positive orthogonal random features\)",
     "Performer FAVOR+（M 个正交正随机特征）"),
    (r"exact for its own pattern, but against full attention relative error ",
     "对自身的稀疏模式是精确的，但相对完整注意力的相对误差为 "),
    (r": relative error ", "：相对误差 "),
    (r"\(worst (\S+): ", r"（最差 \1："),
    (r"Worse than ignoring q and k and outputting the mean of V in (\d+) of (\d+) runs \(",
     r"在 \2 次运行中有 \1 次不如忽略 q 和 k、直接输出 V 的均值（"),
    (r"Slower than exact attention in (\d+) of (\d+) \(T, (\w+)\) settings on some input, "
     r"worst (\S+)× \((\S+ \S+) vs (\S+ \S+): ", r"在 \2 种 (T, \3) 设置中有 \1 种至少在一种输入上"
     r"比精确注意力慢，最差慢 \4 倍（\5 对 \6："),
    (r"Never slower than exact attention in these runs\.", "这些运行中从未比精确注意力慢。"),
    (r"On the Gaussian inputs, faster than exact at every T measured from: ",
     "在高斯输入上，从以下长度起每个测量的 T 都比精确注意力快："),
    (r"On the Gaussian inputs, not faster at the longest T measured for ",
     "在高斯输入上，在测量的最长 T 处并不更快："),
    (r"More peak memory than exact in (\d+) of (\d+) runs, worst (\S+)× \((\S+) MiB: ",
     r"在 \2 次运行中有 \1 次峰值内存高于精确注意力，最差 \3 倍（\4 MiB："),
    (r"(\d+) of (\d+)", r"\2 次中 \1 次"),
    (r"At T=(\d+) \(causal, (\S+)\): (\S+)× faster than dense \((\S+ \S+) vs (\S+ \S+)\), "
     r"(\S+)× its memory, error (\S+)\.",
     r"在 T=\1（因果，\2）：比稠密注意力快 \3 倍（\4 对 \5），内存为其 \6 倍，误差 \7。"),
    (r" from T=", " 起于 T="),
    (r"\)\.", "）。"), (r"\.$", "。"),
    (r"relative error ‖out − exact‖ / ‖exact‖ \(floor 1e-8\)",
     "相对误差 ‖out − exact‖ / ‖exact‖（下限 1e-8）"),
    (r"(time|peak memory) ÷ exact attention's \(left of the dashed line = cheaper\)",
     lambda m: ("时间" if m.group(1) == "time" else "峰值内存")
     + " ÷ 精确注意力的对应值（虚线左侧 = 更省）"),
    (r"output mean\(V\) \(per T\)", "输出 mean(V)（每个 T）"),
    (r"T \(tokens\)", "T（词元数）"), (r"time \(ms, best of repeats\)", "时间（ms，多次中最好）"),
    # ---- bench
    (r"attnlab bench · (\d+) threads? · median of (\d+) runs \[min–max\] · (\S+) s",
     r"attnlab bench · \1 个线程 · \2 次运行的中位数 [最小–最大] · \3 s"),
    (r"Attention forward, (\w+), B=(\d+) H=(\d+) D=(\d+), T=S, no mask: throughput "
     r"\(GFLOP/s, ", r"注意力前向，\1，B=\2 H=\3 D=\4，T=S，无掩码：吞吐量（GFLOP/s，"),
    (r"Attention forward, (\w+), B=(\d+) H=(\d+) D=(\d+), T=S, causal: throughput "
     r"\(GFLOP/s, ", r"注意力前向，\1，B=\2 H=\3 D=\4，T=S，因果：吞吐量（GFLOP/s，"),
    (r"Peak extra memory \(MiB; NumPy: tracemalloc, with the RSS growth in brackets; torch: "
     r"RSS growth\)", "额外峰值内存（MiB；NumPy：tracemalloc，括号内为 RSS 增长；torch：RSS 增长）"),
    (r"\(rss ([^)]*)\)", r"（rss \1）"),
    (r"(GFLOP/s，[^)]*)\)", r"\1）"),
    (r"Decode latency per token \(ms\), TinyDecoder ", "每个词元的解码延迟（ms），TinyDecoder "),
    (r"^context(\s+)cached(\s+)uncached(\s+)speed-up(\s+)KVCache\.attend alone",
     r"上下文\1有缓存\2  无缓存\3加速比\4单独 KVCache.attend"),
    (r"KVCache\.attend alone", "单独 KVCache.attend"),
    (r"^  cached: ", "  有缓存："), (r"^  uncached: ", "  无缓存："), (r"^  attend: ", "  attend："),
    (r" × context \(R² ", " × 上下文（R² "), (r"\); log-log slope ", "）；对数坐标斜率 "),
    (r"Generate (\d+) tokens after a (\d+)-token prompt \(median of (\d+) runs \[min–max\]\)",
     r"在 \2 个词元的提示之后生成 \1 个词元（\3 次运行的中位数 [最小–最大]）"),
    (r"^  cached   ", "  有缓存   "), (r"^  uncached ", "  无缓存 "),
    (r"^  speed-up (\S+); same tokens: yes \(max \|Δlogit\| (\S+)\)",
     r"  加速比 \1；生成的词元相同：是（最大 |Δlogit| \2）"),
    (r"^  speed-up (\S+); same tokens: NO \(max \|Δlogit\| (\S+)\)",
     r"  加速比 \1；生成的词元相同：否（最大 |Δlogit| \2）"),
    (r"Attention forward throughput, (\w+), H=(\d+) D=(\d+), (\d+) thread\(s\)",
     r"注意力前向吞吐量，\1，H=\2 D=\3，\4 个线程"),
    (r"GFLOP/s \(median, min–max\)", "GFLOP/s（中位数，最小–最大）"),
    (r"peak extra memory \(MiB\)", "额外峰值内存（MiB）"),
    (r"Peak memory \(NumPy: tracemalloc; torch: RSS growth\)",
     "峰值内存（NumPy：tracemalloc；torch：RSS 增长）"),
    (r"model step, KV cache", "模型单步，KV 缓存"), (r"model step, recompute all", "模型单步，全部重算"),
    (r"context length \(tokens\)", "上下文长度（词元数）"),
    (r"latency per token \(ms\)", "每个词元的延迟（ms）"),
    (r"TinyDecoder: one decoding step vs context", "TinyDecoder：单步解码与上下文长度"),
    (r"^KV cache$", "KV 缓存"), (r"^recompute all$", "全部重算"), (r"^seconds$", "秒"),
    (r"(\d+) tokens after a (\d+)-token prompt: (\S+)× faster",
     r"\2 个词元的提示之后生成 \1 个词元：快 \3 倍"),
    # ---- the CLI's own lines
    (r"^wrote ", "已写入 "),
    (r"\(pass --out DIR to write approx\.json and the plots\)",
     "（加上 --out DIR 可写出 approx.json 和图）"),
    (r"^note: no plot \((.*)\)$", r"说明：未画图（\1）"),
    (r": timing (\d+) calls, (\d+) interleaved rounds", r"：计时 \1 次调用，交错 \2 轮"),
    (r"dense causal attention \(a (\d+)×\d+ float32 score matrix, once\)",
     r"稠密因果注意力（一个 \1×\1 的 float32 分数矩阵，只算一次）"),
]
_COMPILED = [(re.compile(pattern, re.MULTILINE), repl) for pattern, repl in ZH_PATTERNS]


def localize(text: str, lang: Lang = "en") -> str:
    """``text`` from a study or the CLI in ``lang``: unchanged for "en"; for "zh" every
    known sentence and heading replaced by its Chinese (names and numbers kept)."""
    if check_lang(lang) == "en":
        return text
    for pattern, repl in _COMPILED:
        text = pattern.sub(repl, text)
    return text


def localize_figure(fig: Figure, lang: Lang = "en") -> Figure:
    """Every text of ``fig`` (titles, axis labels, legends, annotations) in ``lang``,
    with the CJK font fallback set on the ones that changed; returns ``fig``."""
    if check_lang(lang) == "en":
        return fig
    from matplotlib.text import Text

    from .fonts import font_context

    with font_context() as families:
        for item in fig.findobj(Text):
            before = item.get_text()
            after = localize(before, lang)
            if after != before:
                item.set_text(after)
                item.set_fontfamily(families)
    return fig
