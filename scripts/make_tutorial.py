# ruff: noqa: E501  (lesson text: a sentence reads best on one line)
"""Write the tutorial notebooks: docs/tutorial/{zh,en}/*.ipynb and their solutions/.

One lesson per section of the three articles the project follows (原文 000, 001, 002).
Chinese is written first, for Chinese readers, with d2l's terms (注意力汇聚, 掩蔽,
层规范化); the English lessons say the same. Each lesson: the idea, the code to run,
an empty cell where the learner writes the article's lines (a stub raising
NotImplementedError), a cell checking it with ``attnlab.exercises.check``, the why in
pictures, and open exercises (练习) at the end. The solutions live in
``solutions/``: each fills the learner's cells and asserts that the check passes, so
running it proves the solution is right. tests/tutorial executes every notebook;
run ``python scripts/make_tutorial.py`` after editing a lesson here (the notebooks
are written without outputs).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "docs" / "tutorial"

SETUP = {
    "zh": """%matplotlib inline
import numpy as np
import matplotlib.pyplot as plt
import attnlab
from attnlab import exercises, report
from attnlab.report.fonts import find_cjk_font
plt.rcParams["font.family"] = ["DejaVu Sans", *filter(None, [find_cjk_font()])]
np.set_printoptions(precision=4, suppress=True)
LANG = "zh"   # attnlab 的文字和图所用的语言：zh 或 en""",
    "en": """%matplotlib inline
import numpy as np
import matplotlib.pyplot as plt
import attnlab
from attnlab import exercises, report
from attnlab.report.fonts import find_cjk_font
plt.rcParams["font.family"] = ["DejaVu Sans", *filter(None, [find_cjk_font()])]
np.set_printoptions(precision=4, suppress=True)
LANG = "en"   # the language of attnlab's text and plots: zh or en""",
}

# A lesson: (file stem, [(kind, content)]): "md" and "code" take {"zh": ..., "en": ...}
# (a plain str for code that needs no comment), "exercise" takes an Exercise.
LESSONS: list[tuple[str, list[tuple[str, object]]]] = []


class Exercise:
    """A cell the learner writes (``stub``) and its answer (``solution``), both per language."""

    def __init__(self, name: str, stub: dict[str, str], solution: dict[str, str]):
        self.name, self.stub, self.solution = name, stub, solution


def lesson(stem: str, *cells: tuple[str, object]) -> None:
    LESSONS.append((stem, [("code", SETUP), *cells]))


def md(zh: str, en: str) -> tuple[str, object]:
    return ("md", {"zh": zh, "en": en})


def code(zh: str, en: str | None = None) -> tuple[str, object]:
    return ("code", {"zh": zh, "en": zh if en is None else en})


def write(name: str, signature: str, zh_body: str, en_body: str, answer: str,
          zh_note: str = "在这里写你的代码", en_note: str = "write your code here") -> tuple[str, object]:
    """The learner's cell: ``def signature:`` with a stub; the solution's ``answer``."""
    stub = {lang: f"def {signature}:\n    # {note}：{body}\n    raise NotImplementedError"
            .replace("：", "：" if lang == "zh" else ": ")
            for lang, note, body in (("zh", zh_note, zh_body), ("en", en_note, en_body))}
    english = re.sub(r" +#[^\n]*[\u4e00-\u9fff][^\n]*", "", answer)  # Chinese comments stay in zh
    solution = {"zh": f"def {signature}:\n{answer}", "en": f"def {signature}:\n{english}"}
    return ("exercise", Exercise(name, stub, solution))


# ----------------------------------------------------------------- 原文 000, sections 1-2
lesson(
    "01_qkv",
    md("# 第 1 课：从输入到 Q、K、V（原文 000，第 1–2 节）\n\n"
       "输入 X 是 3 个词元（单词），每个 4 维。三个权重矩阵 Wq、Wk、Wv（4×3）把 X 投影成"
       "查询 Q（我要找什么）、键 K（我凭什么被找到）、值 V（被关注时我交出去的内容）。"
       "这三个矩阵在真实模型里是训练出来的；这里先随机初始化。",
       "# Lesson 1: from the input to Q, K, V (article 000, sections 1–2)\n\n"
       "The input X holds 3 tokens (words) of 4 dims. Three weight matrices Wq, Wk, Wv "
       "(4×3) project X into queries Q (what I look for), keys K (what I can be found by) "
       "and values V (what I hand over when attended to). In a real model they are learned; "
       "here they start random."),
    code("X = np.array([[1, 0, 1, 0],    # 词元 1\n"
         "              [0, 2, 0, 2],    # 词元 2\n"
         "              [1, 1, 1, 1.]])  # 词元 3\n"
         "rng = np.random.default_rng(0)\n"
         "Wq, Wk, Wv = (rng.standard_normal((4, 3)) for _ in range(3))   # 形状 (E, D) = (4, 3)\n"
         "print(X.shape, Wq.shape)",
         "X = np.array([[1, 0, 1, 0],    # token 1\n"
         "              [0, 2, 0, 2],    # token 2\n"
         "              [1, 1, 1, 1.]])  # token 3\n"
         "rng = np.random.default_rng(0)\n"
         "Wq, Wk, Wv = (rng.standard_normal((4, 3)) for _ in range(3))   # shape (E, D) = (4, 3)\n"
         "print(X.shape, Wq.shape)"),
    md("## 动手写\n\n写出原文的三行：`Q = X @ Wq` 等，返回 `(Q, K, V)`。形状：(T, E)·(E, D) = (T, D)。"
       "写完运行下一格，`exercises.check` 会用随机输入和边界情况检查你的函数，并告诉你哪里不对。",
       "## Your turn\n\nWrite the article's three lines, `Q = X @ Wq` and so on, and return "
       "`(Q, K, V)`. Shapes: (T, E)·(E, D) = (T, D). Then run the next cell: `exercises.check` "
       "tries your function on random inputs and edge cases and tells you what is wrong."),
    write("qkv", "qkv(X, Wq, Wk, Wv)", "返回 (Q, K, V)", "return (Q, K, V)",
          "    return X @ Wq, X @ Wk, X @ Wv"),
    md("**看什么**：Q 的每一行属于 X 的一行（一个词元）。attnlab 的 `explain` 把这些中间结果都记下来，"
       "后面几课会用到它。",
       "**What to look at**: each row of Q belongs to one row of X (one token). attnlab's "
       "`explain` records all these intermediates; later lessons use it."),
    code("trace = attnlab.explain(X=X, Wq=Wq, Wk=Wk, Wv=Wv)\n"
         "print(trace.get(\"Q\").values)"),
    md("## 练习\n\n1. 把 Wq 换成另一个随机矩阵，Q 变了吗？K、V 呢？\n"
       "2. 如果 Wq 的形状是 (4, 5)，Q 的形状是多少？Wk 必须是什么形状，后面的 Q Kᵀ 才能算？\n"
       "3. Wv 的宽度 d_v 一定要等于 d_k 吗？为什么？",
       "## Exercises\n\n1. Replace Wq by another random matrix: does Q change? K, V?\n"
       "2. If Wq is (4, 5), what is Q's shape? What shape must Wk have for Q Kᵀ to exist?\n"
       "3. Must the width d_v of Wv equal d_k? Why?"),
)

# ----------------------------------------------------------------- 原文 000, section 3
lesson(
    "02_scores_scaling_softmax",
    md("# 第 2 课：注意力分数、缩放、softmax（原文 000，第 3 节）\n\n"
       "注意力分数 = Q Kᵀ（每个查询和每个键的点积）；缩放：除以 √d_k；softmax 把每一行变成和为 1 的注意力权重。",
       "# Lesson 2: scores, scaling, softmax (article 000, section 3)\n\n"
       "Scores = Q Kᵀ (every query's dot product with every key); scaling: divide by √d_k; "
       "softmax turns each row into attention weights summing to 1."),
    code("rng = np.random.default_rng(0)\nQ, K = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))   # T = 3, S = 5, d_k = 4"),
    md("## 动手写（1）：分数\n\n`Q` 是 (T, D)，`K` 是 (S, D)，分数是 (T, S)：第 i 行是第 i 个查询对每个键的点积。",
       "## Your turn (1): the scores\n\n`Q` is (T, D), `K` is (S, D), the scores are (T, S): "
       "row i holds query i's dot product with every key."),
    write("scores", "scores(Q, K)", "返回 (T, S) 的分数", "return the (T, S) scores",
          "    return Q @ K.T"),
    md("## 动手写（2）：缩放\n\n再除以 √d_k（d_k 是键向量的维度）。",
       "## Your turn (2): scaling\n\nNow divide by √d_k (d_k is the width of a key vector)."),
    write("scaled_scores", "scaled_scores(Q, K)", "Q Kᵀ / √d_k", "Q Kᵀ / √d_k",
          "    return Q @ K.T / np.sqrt(K.shape[-1])"),
    md("## 为什么要除以 √d_k：画出来\n\nq、k 的每一维都是均值 0、方差 1 的随机数时，点积 q·k 是 d_k 项之和，"
       "方差随 d_k 线性增长（Karpathy 在《Let's build GPT》里就是这样用 `q.var()`、`k.var()`、`wei.var()` 演示的）。"
       "方差大，softmax 就饱和：几乎所有权重压到一个键上，其余键的梯度几乎为 0。除以 √d_k 把方差拉回 1。",
       "## Why divide by √d_k: in pictures\n\nWith q and k of mean 0 and variance 1 in every "
       "dim, q·k is a sum of d_k terms and its variance grows linearly with d_k (Karpathy's "
       "`q.var()`, `k.var()`, `wei.var()` demonstration in \"Let's build GPT\"). A large "
       "variance saturates the softmax: nearly all weight on one key, nearly zero gradient "
       "for the rest. Dividing by √d_k brings the variance back to 1."),
    code("rng = np.random.default_rng(0)\n"
         "dims = [4, 16, 64, 256]\n"
         "raw_var, scaled_var, raw_top, scaled_top = [], [], [], []\n"
         "for d_k in dims:\n"
         "    q, k = rng.standard_normal((2000, d_k)), rng.standard_normal((2000, d_k))\n"
         "    dots = (q * k).sum(-1)                       # 2000 个点积 q·k\n"
         "    raw_var.append(dots.var()); scaled_var.append((dots / np.sqrt(d_k)).var())\n"
         "    rows = (q[:800] @ k[:8].T).reshape(100, 8, 8)[:, 0]   # 100 行、每行 8 个键的分数\n"
         "    raw_top.append(attnlab.softmax(rows).max(-1).mean())\n"
         "    scaled_top.append(attnlab.softmax(rows / np.sqrt(d_k)).max(-1).mean())\n"
         "fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3))\n"
         "a.plot(dims, raw_var, \"o-\", label=\"q·k\"); a.plot(dims, scaled_var, \"o-\", label=\"q·k / √d_k\")\n"
         "a.set_xscale(\"log\", base=2); a.set_xlabel(\"d_k\"); a.set_title(\"方差 Var\"); a.legend()\n"
         "b.plot(dims, raw_top, \"o-\", label=\"不缩放\"); b.plot(dims, scaled_top, \"o-\", label=\"除以 √d_k\")\n"
         "b.set_xscale(\"log\", base=2); b.set_xlabel(\"d_k\"); b.set_title(\"每行最大权重（8 个键）\"); b.legend()\n"
         "print(\"方差:\", np.round(raw_var, 1), \"缩放后:\", np.round(scaled_var, 2))",
         "rng = np.random.default_rng(0)\n"
         "dims = [4, 16, 64, 256]\n"
         "raw_var, scaled_var, raw_top, scaled_top = [], [], [], []\n"
         "for d_k in dims:\n"
         "    q, k = rng.standard_normal((2000, d_k)), rng.standard_normal((2000, d_k))\n"
         "    dots = (q * k).sum(-1)                       # 2000 dot products q·k\n"
         "    raw_var.append(dots.var()); scaled_var.append((dots / np.sqrt(d_k)).var())\n"
         "    rows = (q[:800] @ k[:8].T).reshape(100, 8, 8)[:, 0]   # 100 rows of scores over 8 keys\n"
         "    raw_top.append(attnlab.softmax(rows).max(-1).mean())\n"
         "    scaled_top.append(attnlab.softmax(rows / np.sqrt(d_k)).max(-1).mean())\n"
         "fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3))\n"
         "a.plot(dims, raw_var, \"o-\", label=\"q·k\"); a.plot(dims, scaled_var, \"o-\", label=\"q·k / √d_k\")\n"
         "a.set_xscale(\"log\", base=2); a.set_xlabel(\"d_k\"); a.set_title(\"variance\"); a.legend()\n"
         "b.plot(dims, raw_top, \"o-\", label=\"unscaled\"); b.plot(dims, scaled_top, \"o-\", label=\"divided by √d_k\")\n"
         "b.set_xscale(\"log\", base=2); b.set_xlabel(\"d_k\"); b.set_title(\"largest weight per row (8 keys)\"); b.legend()\n"
         "print(\"variance:\", np.round(raw_var, 1), \"scaled:\", np.round(scaled_var, 2))"),
    md("**看什么**：左图不缩放时方差 ≈ d_k，缩放后 ≈ 1；右图不缩放时 d_k 越大，每行最大权重越接近 1（饱和）。"
       "原文说缩放是为了“防止梯度消失”：在 d_k = 64 这样的宽度上，具体的害处就是这种饱和——"
       "权重接近 one-hot 时 softmax 的梯度接近 0。\n\n"
       "同一个色标上比较分数和缩放后的分数（颜色一样深浅代表一样的数值）：",
       "**What to look at**: left, the unscaled variance ≈ d_k, scaled ≈ 1; right, unscaled, "
       "the larger d_k the closer each row's largest weight gets to 1 (saturation). The "
       "article says scaling \"prevents vanishing gradients\": at widths like d_k = 64 the "
       "concrete harm is this saturation, since a softmax near one-hot has gradients near 0.\n\n"
       "Scores and scaled scores on one colour scale (the same shade means the same value):"),
    code("rng = np.random.default_rng(1)\n"
         "q, k = rng.standard_normal((6, 64)), rng.standard_normal((6, 64))\n"
         "raw, scaled = q @ k.T, q @ k.T / np.sqrt(64)\n"
         "lim = np.abs(raw).max()\n"
         "fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))\n"
         "for ax, m, title in zip(axes, (raw, scaled), (\"Q Kᵀ\", \"Q Kᵀ / √d_k\")):\n"
         "    image = ax.imshow(m, cmap=\"RdBu_r\", vmin=-lim, vmax=lim); ax.set_title(title)\n"
         "fig.colorbar(image, ax=axes)"),
    md("## 动手写（3）：softmax\n\n每一行变成和为 1 的权重。原文 000 的写法 `np.exp(s) / np.sum(np.exp(s), axis=1, keepdims=True)` "
       "在分数很大（例如 1000）时会溢出：先减去每行的最大值（数学上不变）。",
       "## Your turn (3): softmax\n\nEach row becomes weights summing to 1. Article 000's "
       "`np.exp(s) / np.sum(np.exp(s), axis=1, keepdims=True)` overflows on large scores "
       "(say 1000): subtract each row's maximum first (mathematically a no-op)."),
    write("softmax", "softmax(x)", "x 是 (T, S)，每一行做 softmax", "x is (T, S), softmax over each row",
          "    shifted = x - np.max(x, axis=-1, keepdims=True)   # 每行减去最大值，exp 不会溢出\n"
          "    e = np.exp(shifted)\n"
          "    return e / np.sum(e, axis=-1, keepdims=True)"),
    md("## 练习\n\n1. 用 `attnlab.explain(scale=1.0)`（命令行 `attnlab explain --no-scale`）关掉缩放，比较每行最大权重。\n"
       "2. 给 `attnlab.explain` 一个很大的输入 `X=[[100, 0, 100, 0], [0, 2, 0, 2], [1, 1, 1, 1]]`，读它的提示（`report.note_lines`）。\n"
       "3. 为什么减去每行最大值不改变 softmax 的结果？减去整个矩阵的最大值行不行？",
       "## Exercises\n\n1. Switch scaling off with `attnlab.explain(scale=1.0)` (on the command "
       "line `attnlab explain --no-scale`) and compare each row's largest weight.\n"
       "2. Give `attnlab.explain` a large input `X=[[100, 0, 100, 0], [0, 2, 0, 2], [1, 1, 1, 1]]` "
       "and read its notes (`report.note_lines`).\n"
       "3. Why does subtracting each row's maximum leave the softmax unchanged? Would the "
       "maximum of the whole matrix do?"),
)

# ----------------------------------------------------------------- 原文 000, sections 4-5
lesson(
    "03_weighted_sum",
    md("# 第 3 课：加权求和——注意力汇聚（原文 000，第 4–5 节）\n\n"
       "输出的第 i 行 = 用第 i 行注意力权重对 V 的各行加权求和（《动手学深度学习》称之为注意力汇聚）。"
       "把前两课连起来，就是缩放点积注意力 softmax(Q Kᵀ / √d_k) V。",
       "# Lesson 3: the weighted sum, attention pooling (article 000, sections 4–5)\n\n"
       "Row i of the output = the rows of V summed with row i's attention weights (d2l calls "
       "it attention pooling). Lessons 1 and 2 joined give scaled dot-product attention, "
       "softmax(Q Kᵀ / √d_k) V."),
    md("## 动手写（1）：缩放点积注意力\n\nQ (T, D)、K (S, D)、V (S, Dv) → 输出 (T, Dv)。可以用上一课你写的 softmax，也可以用 `attnlab.softmax`。",
       "## Your turn (1): scaled dot-product attention\n\nQ (T, D), K (S, D), V (S, Dv) → "
       "output (T, Dv). Use your softmax from lesson 2 or `attnlab.softmax`."),
    write("attention", "attention(Q, K, V)", "softmax(Q Kᵀ / √d_k) V", "softmax(Q Kᵀ / √d_k) V",
          "    weights = attnlab.softmax(Q @ K.T / np.sqrt(K.shape[-1]))   # (T, S)\n"
          "    return weights @ V                                          # (T, Dv)"),
    md("## 动手写（2）：原文 000 的完整函数 `self_attention(X, Wq, Wk, Wv)`",
       "## Your turn (2): article 000's whole function `self_attention(X, Wq, Wk, Wv)`"),
    write("self_attention", "self_attention(X, Wq, Wk, Wv)", "先投影，再注意力", "project, then attend",
          "    Q, K, V = X @ Wq, X @ Wk, X @ Wv\n"
          "    weights = attnlab.softmax(Q @ K.T / np.sqrt(K.shape[-1]))\n"
          "    return weights @ V"),
    md("## 数据流与形状\n\n下面这张图是 X → Q、K、V → 分数 → 权重 → 输出，每一步标出形状。"
       "遇到维度不匹配，attnlab 会说出是哪个参数、期望什么、实际得到什么（原文 000 的常见问题排查）：",
       "## The data flow, with shapes\n\nX → Q, K, V → scores → weights → output, each step "
       "with its shape. On a shape mismatch attnlab names the argument, what it expected and "
       "what it got (article 000's troubleshooting list):"),
    code("T, E, D, Dv = 3, 4, 3, 2\n"
         "steps = [(\"X\", (T, E)), (\"Q = X Wq\", (T, D)), (\"K = X Wk\", (T, D)), (\"V = X Wv\", (T, Dv)),\n"
         "         (\"Q Kᵀ / √d_k\", (T, T)), (\"softmax\", (T, T)), (\"weights @ V\", (T, Dv))]\n"
         "fig, ax = plt.subplots(figsize=(10, 1.6)); ax.axis(\"off\")\n"
         "for i, (name, shape) in enumerate(steps):\n"
         "    ax.add_patch(plt.Rectangle((i * 1.4, 0), 1.1, 0.5 + 0.1 * shape[1], fill=False))\n"
         "    ax.text(i * 1.4 + 0.55, -0.25, f\"{name}\\n{shape}\", ha=\"center\", va=\"top\", fontsize=8)\n"
         "    if i: ax.annotate(\"\", (i * 1.4, 0.3), (i * 1.4 - 0.3, 0.3), arrowprops={\"arrowstyle\": \"->\"})\n"
         "ax.set_xlim(-0.2, 10); ax.set_ylim(-1, 1.2)\n"
         "rng = np.random.default_rng(0)\n"
         "X, Wq, Wk, Wv = rng.standard_normal((3, 4)), *(rng.standard_normal((4, 3)) for _ in range(3))\n"
         "try:\n    attnlab.self_attention(X, Wq[:3], Wk, Wv)\n"
         "except attnlab.AttnlabError as error:\n    print(error)"),
    md("## 练习\n\n1. 用权重手算输出的第一行：`weights[0] @ V`。\n"
       "2. 如果某一行权重是 one-hot（只有一个 1），这一行输出是什么？\n"
       "3. 权重是均匀的（每个 1/S）时，输出每一行都一样吗？原文 000 的排查清单说“权重均匀”是个问题，为什么？",
       "## Exercises\n\n1. Compute the output's first row by hand: `weights[0] @ V`.\n"
       "2. If a row of weights is one-hot, what is that row of output?\n"
       "3. With uniform weights (1/S each), are all output rows the same? Article 000's "
       "checklist calls uniform weights a problem: why?"),
)

# ----------------------------------------------------------------- 原文 000, section 6
lesson(
    "04_heatmap",
    md("# 第 4 课：把中间结果画出来，因果掩蔽（原文 000，第 6 节）\n\n"
       "行是查询（Query），列是键（Key）。attnlab 把注意力分数、缩放后的分数和注意力权重并排画出。"
       "语言模型生成文字时，第 i 个词元只能看到它前面的词元：这就是因果掩蔽。",
       "# Lesson 4: drawing the intermediates, the causal mask (article 000, section 6)\n\n"
       "Rows are queries, columns keys. attnlab draws the scores, the scaled scores and the "
       "weights side by side. When a language model writes, token i sees only the tokens "
       "before it: that is the causal mask."),
    code("trace = attnlab.explain(tokens=[\"小明\", \"去了\", \"学校\"], is_causal=True)\n"
         "report.plot(trace, lang=LANG)"),
    md("**看什么**：右上方被掩蔽的格子画成灰色斜线，而不是写 0.00：它的权重为 0 是因为掩码，不是因为分数小。"
       "注意：因果掩蔽下“去了”看不到“学校”——原文 002 讲的“去了 → 学校”在这里是被禁止的；"
       "这里的权重是随机的，只是在演示掩码。\n\n"
       "## 动手写：因果掩码\n\n返回 (T, T) 的布尔矩阵，**True = 可以关注**（attnlab 全库只用这一种约定）。",
       "**What to look at**: the masked cells top right are grey and hatched, not written "
       "0.00: their weight is 0 because of the mask, not the scores. Note that under the "
       "causal mask 去了 cannot see 学校: article 002's story \"去了 → 学校\" is forbidden here; "
       "the weights are random, this only shows the mask.\n\n"
       "## Your turn: the causal mask\n\nReturn a (T, T) boolean matrix, **True = may "
       "attend** (the one convention across attnlab)."),
    write("causal_mask", "causal_mask(T)", "True = 可以关注", "True = may attend",
          "    return np.tril(np.ones((T, T), dtype=bool))   # 下三角（含对角线）"),
    md("## 练习\n\n1. 数一数 T 个词元的因果掩码屏蔽了多少个格子。\n"
       "2. 为什么对角线要为 True？\n3. 用 `report.plot` 画出不加掩码的同一句话，比较第一行。",
       "## Exercises\n\n1. How many cells does a causal mask over T tokens block?\n"
       "2. Why must the diagonal be True?\n3. Plot the same sentence without the mask "
       "(`report.plot`) and compare the first row."),
)

# ----------------------------------------------------------------- multi-head
lesson(
    "05_multi_head",
    md("# 第 5 课：多头注意力（原文 000 第 7 节，原文 001 第 2 节）\n\n"
       "原文 000 给每个头各自的 Wq、Wk、Wv，再拼接；原文 001 先做一次 d_model 宽的投影，"
       "再 `.view(B, T, h, d_k).transpose(1, 2)` 拆成 h 个头。两者是同一个计算（本课最后的练习验证它）。",
       "# Lesson 5: multi-head attention (article 000 section 7, article 001 section 2)\n\n"
       "Article 000 gives each head its own Wq, Wk, Wv and concatenates; article 001 "
       "projects once to d_model and splits into h heads with `.view(B, T, h, d_k)"
       ".transpose(1, 2)`. They are the same computation (the last exercise checks it)."),
    md("## 先看图：每个张量的形状\n\n"
       "下图从 X (T, E) 一路画到输出 (T, E)，每一步旁边写着形状，数字取 T = 4 个词元、H = 2 个头、E = 8，"
       "所以每个头的维度 D = E / H = 4。注意形状只在两处改变布局：拆头（view + transpose 得到 (H, T, D)）"
       "和拼接（transpose 回来再 reshape 成 (T, H·Dv)）；每个头的分数和权重都是 (T, T) 的方阵。"
       "右边两栏是同一个子层外面的两种包法：原文 001 的后置规范化 `LayerNorm(x + attention(x))`，"
       "和 GPT-2 之后常用的前置规范化 `x + attention(LayerNorm(x))`（第 8 课再细讲）。"
       "命令行里也能画：`attnlab draw dataflow --lang zh --heads 4 --d-model 16`。",
       "## First the picture: the shape of every tensor\n\n"
       "The figure goes from X (T, E) to the output (T, E), each step with its shape, for "
       "T = 4 tokens, H = 2 heads and E = 8, so each head has D = E / H = 4. The layout "
       "changes in only two places: the split (view + transpose gives (H, T, D)) and the "
       "concatenation (transpose back, reshape to (T, H·Dv)); each head's scores and "
       "weights are a square (T, T). The two columns on the right wrap the same sublayer "
       "two ways: article 001's post-LN `LayerNorm(x + attention(x))` and the pre-LN "
       "`x + attention(LayerNorm(x))` used since GPT-2 (more in lesson 8). From the "
       "command line: `attnlab draw dataflow --heads 4 --d-model 16`."),
    code("report.draw_dataflow(LANG, T=4, num_heads=2, d_model=8)"),
    md("## 动手写（1）：拆成多个头\n\n(B, T, E) → (B, H, T, D)，D = E / H。",
       "## Your turn (1): split into heads\n\n(B, T, E) → (B, H, T, D), D = E / H."),
    write("split_heads", "split_heads(x, num_heads)", "(B, T, E) -> (B, H, T, D)", "(B, T, E) -> (B, H, T, D)",
          "    B, T, E = x.shape\n"
          "    x = x.reshape(B, T, num_heads, E // num_heads)   # (B, T, H, D)\n"
          "    return x.transpose(0, 2, 1, 3)                    # (B, H, T, D)"),
    md("## 动手写（2）：把头拼回来\n\n(B, H, T, D) → (B, T, H·D)。",
       "## Your turn (2): merge the heads\n\n(B, H, T, D) → (B, T, H·D)."),
    write("merge_heads", "merge_heads(heads)", "(B, H, T, D) -> (B, T, H*D)", "(B, H, T, D) -> (B, T, H*D)",
          "    B, H, T, D = heads.shape\n"
          "    return heads.transpose(0, 2, 1, 3).reshape(B, T, H * D)   # (B, T, H, D) -> (B, T, H*D)"),
    md("## 动手写（3）：多头注意力\n\nX (T, E)，四个 (E, E) 的权重：投影、拆头、每个头做缩放点积注意力（d_k = E / H）、拼接、乘以 Wo。",
       "## Your turn (3): multi-head attention\n\nX (T, E), four (E, E) weights: project, "
       "split, scaled dot-product attention per head (d_k = E / H), concatenate, times Wo."),
    write("multi_head_attention", "multi_head_attention(X, Wq, Wk, Wv, Wo, num_heads)",
          "返回 (T, E)", "return (T, E)",
          "    T, E = X.shape\n"
          "    D = E // num_heads\n"
          "    q, k, v = ((X @ W).reshape(T, num_heads, D).transpose(1, 0, 2) for W in (Wq, Wk, Wv))  # (H, T, D)\n"
          "    weights = attnlab.softmax(q @ k.transpose(0, 2, 1) / np.sqrt(D))   # (H, T, T)\n"
          "    heads = weights @ v                                                # (H, T, D)\n"
          "    return heads.transpose(1, 0, 2).reshape(T, E) @ Wo                 # (T, E)"),
    code("X = np.random.default_rng(0).standard_normal((4, 8))\n"
         "b = attnlab.explain(X, num_heads=2, split=\"fused\", seed=1)\n"
         "report.plot(b, lang=LANG)"),
    md("## 练习\n\n1. 验证两种拆分给出同样的结果：`attnlab.explain(X, num_heads=2, d_k=4, split=\"per_head\", seed=1)` "
       "和 `split=\"fused\"` 的 `.weights()`、`.output` 比较（差别小于 1e-12）。\n"
       "2. 原文 001 说不同的头学到句法、指代等不同关系。随机初始化的头有这些关系吗？（提示：第 11 课）\n"
       "3. 头数 H 翻倍、E 不变时，参数量变不变？计算量呢？",
       "## Exercises\n\n1. Check that the two layouts agree: compare `.weights()` and `.output` of "
       "`attnlab.explain(X, num_heads=2, d_k=4, split=\"per_head\", seed=1)` and `split=\"fused\"` "
       "(within 1e-12).\n2. Article 001 says heads learn syntax, coreference and so on. Do "
       "randomly initialised heads? (Hint: lesson 11.)\n3. Doubling H at fixed E: does the "
       "parameter count change? The compute?"),
)

# ----------------------------------------------------------------- masks
lesson(
    "06_masks",
    md("# 第 6 课：掩蔽（原文 000 第 8 节，原文 001 第 1 节）\n\n"
       "两篇原文的掩码含义相反：原文 000 里 1 = 屏蔽（`mask * -1e9`），原文 001 里 0 = 屏蔽"
       "（`masked_fill(mask == 0, -1e9)`）。attnlab 只用一种：布尔值，True = 可以关注。"
       "`attnlab.from_blocked` 和 `attnlab.from_keep` 负责转换。",
       "# Lesson 6: masking (article 000 section 8, article 001 section 1)\n\n"
       "The two articles' masks mean opposite things: in 000, 1 = blocked (`mask * -1e9`), "
       "in 001, 0 = blocked (`masked_fill(mask == 0, -1e9)`). attnlab has one convention: "
       "bool, True = may attend. `attnlab.from_blocked` and `attnlab.from_keep` convert."),
    code("seed000_mask = np.array([[0, 0, 1], [0, 0, 1], [0, 0, 1]])   # 原文 000：1 = 屏蔽\n"
         "allowed = attnlab.from_blocked(seed000_mask)                  # attnlab：True = 可以关注\n"
         "print(allowed)",
         "seed000_mask = np.array([[0, 0, 1], [0, 0, 1], [0, 0, 1]])   # article 000: 1 = blocked\n"
         "allowed = attnlab.from_blocked(seed000_mask)                  # attnlab: True = may attend\n"
         "print(allowed)"),
    md("## 动手写（1）：填充掩码\n\n一批句子长短不一，短的补上填充词元。valid_lens[b] 是第 b 句的真实长度：返回 (B, S) 的布尔矩阵，True = 真实词元。",
       "## Your turn (1): the padding mask\n\nSentences in a batch differ in length; the short "
       "ones are padded. valid_lens[b] is sentence b's real length: return a (B, S) boolean "
       "matrix, True = a real token."),
    write("padding_mask", "padding_mask(valid_lens, S)", "True = 真实词元", "True = a real token",
          "    return np.arange(S)[None, :] < np.asarray(valid_lens)[:, None]   # (B, S)"),
    md("## 动手写（2）：掩蔽的注意力\n\nmask 为 False 的位置在 softmax 之前设为 -inf。"
       "一整行都被掩蔽时（例如左填充加因果掩码的第一行）怎么办？原文 000 的 -1e9 配上减去最大值的 softmax 会**悄悄地忽略掩码**："
       "这一行的每个分数都减去了同一个 1e9，softmax 又把它减掉了。attnlab 的约定是这一行输出 0。",
       "## Your turn (2): masked attention\n\nPositions where mask is False become -inf before "
       "the softmax. What if a whole row is masked (the first row under left padding plus a "
       "causal mask)? Article 000's -1e9 with a max-subtracted softmax **silently ignores "
       "the mask**: every score of the row lost the same 1e9, which the softmax subtracts "
       "away. attnlab's rule: that row outputs 0."),
    write("masked_attention", "masked_attention(Q, K, V, mask)", "mask (T, S)，True = 可以关注", "mask (T, S), True = may attend",
          "    scores = np.where(mask, Q @ K.T / np.sqrt(K.shape[-1]), -np.inf)   # (T, S)\n"
          "    anything = mask.any(axis=-1, keepdims=True)                         # 这一行有可以关注的键吗\n"
          "    weights = attnlab.softmax(np.where(anything, scores, 0.0))           # 全掩蔽的行先放 0，免得 NaN\n"
          "    return np.where(anything, weights @ V, 0.0)                          # 全掩蔽的行输出 0"),
    code("keep = np.array([False, True, True])   # 左填充：第 0 个位置是 [PAD]\n"
         "left = attnlab.explain(tokens=[\"[PAD]\", \"小明\", \"去了\"], key_padding=keep, is_causal=True)\n"
         "print(left.get(\"weights\").values)\n"
         "for line in report.note_lines(left, LANG):\n    print(\"-\", line)",
         "keep = np.array([False, True, True])   # left padding: position 0 is [PAD]\n"
         "left = attnlab.explain(tokens=[\"[PAD]\", \"小明\", \"去了\"], key_padding=keep, is_causal=True)\n"
         "print(left.get(\"weights\").values)\n"
         "for line in report.note_lines(left, LANG):\n    print(\"-\", line)"),
    md("## 练习\n\n1. 把原文 001 的掩码（0 = 屏蔽）用 `attnlab.from_keep` 转成 attnlab 的约定。\n"
       "2. 用原文 000 的写法 `scores + mask * -1e9` 算一整行被屏蔽的情况，再和 `attnlab.scaled_dot_product_attention` 比较。\n"
       "3. 右填充时，填充词元自己那一行（作为查询）要不要掩蔽？它的输出会被用到吗？",
       "## Exercises\n\n1. Convert article 001's mask (0 = blocked) with `attnlab.from_keep`.\n"
       "2. Compute a fully masked row with article 000's `scores + mask * -1e9`, and compare "
       "with `attnlab.scaled_dot_product_attention`.\n3. Under right padding, must the padding "
       "token's own row (as a query) be masked? Is its output ever used?"),
)

# ----------------------------------------------------------------- positions
lesson(
    "07_positional_encoding",
    md("# 第 7 课：位置编码（原文 001 第 3 节）\n\n"
       "自注意力本身不看顺序：把句子里的词元换个顺序，输出只是跟着换了顺序（《动手学深度学习》10.6 节）。",
       "# Lesson 7: positional encoding (article 001 section 3)\n\n"
       "Self-attention ignores order by itself: permute the tokens of a sentence and the "
       "output is permuted the same way, nothing else (d2l section 10.6)."),
    code("rng = np.random.default_rng(0)\n"
         "X = rng.standard_normal((5, 8)); Wq, Wk, Wv = (rng.standard_normal((8, 4)) for _ in range(3))\n"
         "order = np.array([3, 0, 4, 1, 2])              # 打乱词元的顺序\n"
         "out, out_shuffled = attnlab.self_attention(X, Wq, Wk, Wv), attnlab.self_attention(X[order], Wq, Wk, Wv)\n"
         "print(np.allclose(out[order], out_shuffled))    # True：输出只是跟着换了顺序\n"
         "pe = attnlab.sinusoidal_encoding(5, 8)\n"
         "with_pe = attnlab.self_attention(X + pe, Wq, Wk, Wv)\n"
         "print(np.allclose(with_pe[order], attnlab.self_attention(X[order] + pe, Wq, Wk, Wv)))   # False",
         "rng = np.random.default_rng(0)\n"
         "X = rng.standard_normal((5, 8)); Wq, Wk, Wv = (rng.standard_normal((8, 4)) for _ in range(3))\n"
         "order = np.array([3, 0, 4, 1, 2])              # shuffle the tokens\n"
         "out, out_shuffled = attnlab.self_attention(X, Wq, Wk, Wv), attnlab.self_attention(X[order], Wq, Wk, Wv)\n"
         "print(np.allclose(out[order], out_shuffled))    # True: the output is only reordered\n"
         "pe = attnlab.sinusoidal_encoding(5, 8)\n"
         "with_pe = attnlab.self_attention(X + pe, Wq, Wk, Wv)\n"
         "print(np.allclose(with_pe[order], attnlab.self_attention(X[order] + pe, Wq, Wk, Wv)))   # False"),
    md("## 动手写：正弦位置编码\n\npe[p, 2i] = sin(p / 10000^(2i/d_model))，pe[p, 2i+1] = cos(同一个角度)。",
       "## Your turn: the sinusoidal encoding\n\npe[p, 2i] = sin(p / 10000^(2i/d_model)), "
       "pe[p, 2i+1] = cos(the same angle)."),
    write("sinusoidal_encoding", "sinusoidal_encoding(max_len, d_model)", "返回 (max_len, d_model)", "return (max_len, d_model)",
          "    position = np.arange(max_len)[:, None]                                  # (L, 1)\n"
          "    div_term = np.exp(np.arange(0, d_model, 2) * -(np.log(10000.0) / d_model))  # (E/2,)\n"
          "    pe = np.zeros((max_len, d_model))\n"
          "    pe[:, 0::2] = np.sin(position * div_term)\n"
          "    pe[:, 1::2] = np.cos(position * div_term)\n"
          "    return pe"),
    code("report.draw(\"positions\", lang=LANG)"),
    md("## 练习\n\n1. 用 `attnlab.explain(tokens=\"the cat sat on the mat\".split())` 看两个 the 的权重行，再加上 `pos=\"sinusoidal\"`。\n"
       "2. RoPE（`pos=\"rope\"`）下，同一个向量放在不同位置时，分数只取决于什么？\n"
       "3. 原文 001 提到可学习的位置嵌入：它能处理比训练时更长的句子吗？",
       "## Exercises\n\n1. Look at the two rows of \"the\" in `attnlab.explain(tokens=\"the cat sat "
       "on the mat\".split())`, then add `pos=\"sinusoidal\"`.\n2. Under RoPE (`pos=\"rope\"`), "
       "with one vector at every position, what do the scores depend on?\n3. Article 001 "
       "mentions learned position embeddings: do they handle sentences longer than in training?"),
)

# ----------------------------------------------------------------- the layer
lesson(
    "08_the_layer",
    md("# 第 8 课：完整的自注意力层：残差与层规范化（原文 001 第 4 节）\n\n"
       "多头输出拼接后乘以 Wo，加上残差，再做层规范化：`LayerNorm(x + attention(x))`（Post-LN，原文 001 的代码）。"
       "原文的文字说现代实现多用 Pre-LN：`x + attention(LayerNorm(x))`——文字和代码不一致，两种都要会。",
       "# Lesson 8: the whole layer: residual and layer normalisation (article 001 section 4)\n\n"
       "The heads' concatenation times Wo, plus the residual, then LayerNorm: `LayerNorm(x + "
       "attention(x))` (post-LN, article 001's code). Its text says modern code prefers "
       "pre-LN, `x + attention(LayerNorm(x))`: text and code disagree, learn both."),
    md("## 动手写（1）：层规范化\n\n每个词元的特征减去均值、除以 √(方差 + ε)，ε = 1e-5，方差除以 E（有偏）。",
       "## Your turn (1): layer normalisation\n\nSubtract each token's feature mean, divide by "
       "√(variance + ε), ε = 1e-5, the variance divided by E (biased)."),
    write("layer_norm", "layer_norm(x)", "沿最后一维规范化", "normalise along the last axis",
          "    mean = x.mean(axis=-1, keepdims=True)\n"
          "    var = x.var(axis=-1, keepdims=True)        # 有偏方差，除以 E\n"
          "    return (x - mean) / np.sqrt(var + 1e-5)"),
    md("## 动手写（2）：残差与层规范化的两种位置\n\n`attention` 和 `layer_norm` 是给定的函数；norm=\"post\" 或 \"pre\"。",
       "## Your turn (2): the two placements of residual and normalisation\n\n`attention` "
       "and `layer_norm` are given functions; norm=\"post\" or \"pre\"."),
    write("residual_block", "residual_block(x, attention, layer_norm, norm)", "post 或 pre", "post or pre",
          "    if norm == \"post\":\n"
          "        return layer_norm(x + attention(x))   # 原文 001 的代码\n"
          "    return x + attention(layer_norm(x))       # Pre-LN"),
    code("post = attnlab.explain(num_heads=2, d_k=2, Wo=True, norm=\"post\")\n"
         "print(post.output.mean(-1), post.output.var(-1))"),
    md("## 练习\n\n1. Post-LN 的输出每行均值为 0、方差约为 1：为什么方差略小于 1？\n"
       "2. 原文 000 的输入里有一行是 [1, 1, 1, 1]：层规范化之后它是什么？为什么需要 ε？\n"
       "3. Pre-LN 的残差路径上没有规范化：这对很深的网络有什么好处？",
       "## Exercises\n\n1. Post-LN rows have mean 0 and variance about 1: why a little under 1?\n"
       "2. Article 000's input has a row [1, 1, 1, 1]: what is it after layer normalisation? "
       "Why is ε needed?\n3. Pre-LN's residual path has no normalisation: how does that help "
       "very deep networks?"),
)

# ----------------------------------------------------------------- efficiency
lesson(
    "09_efficiency",
    md("# 第 9 课：实战中的优化（原文 001 第 5 节）\n\n"
       "Flash Attention 按块读取键，每一行只保留三个运行量：最大值 m、指数和 l、输出的累加 acc，"
       "从不保存 (T, S) 的矩阵。下面一块一块地算，每一步打印这三个量：",
       "# Lesson 9: the tricks of practice (article 001 section 5)\n\n"
       "Flash attention reads the keys tile by tile and keeps three running quantities per "
       "row: the maximum m, the sum of exponentials l and the output accumulator acc; the "
       "(T, S) matrix is never stored. Tile by tile, printing the three:"),
    code("rng = np.random.default_rng(0)\n"
         "q, K, V = rng.standard_normal(4), rng.standard_normal((8, 4)), rng.standard_normal((8, 2))\n"
         "m, l, acc = -np.inf, 0.0, np.zeros(2)\n"
         "for start in range(0, 8, 2):                          # 每次 2 个键\n"
         "    s = K[start:start + 2] @ q / np.sqrt(4)           # 这一块的分数\n"
         "    m_new = max(m, s.max())\n"
         "    correction = np.exp(m - m_new)                     # 旧的 l、acc 按新的最大值重新缩放\n"
         "    p = np.exp(s - m_new)\n"
         "    l, acc, m = l * correction + p.sum(), acc * correction + p @ V[start:start + 2], m_new\n"
         "    print(f\"键 {start}-{start + 1}: m = {m:.3f}, l = {l:.3f}, acc = {np.round(acc, 3)}\")\n"
         "print(\"acc / l =\", acc / l)\n"
         "print(\"完整计算 =\", attnlab.scaled_dot_product_attention(q[None], K, V)[0])",
         "rng = np.random.default_rng(0)\n"
         "q, K, V = rng.standard_normal(4), rng.standard_normal((8, 4)), rng.standard_normal((8, 2))\n"
         "m, l, acc = -np.inf, 0.0, np.zeros(2)\n"
         "for start in range(0, 8, 2):                          # 2 keys at a time\n"
         "    s = K[start:start + 2] @ q / np.sqrt(4)           # this tile's scores\n"
         "    m_new = max(m, s.max())\n"
         "    correction = np.exp(m - m_new)                     # rescale the old l, acc to the new max\n"
         "    p = np.exp(s - m_new)\n"
         "    l, acc, m = l * correction + p.sum(), acc * correction + p @ V[start:start + 2], m_new\n"
         "    print(f\"keys {start}-{start + 1}: m = {m:.3f}, l = {l:.3f}, acc = {np.round(acc, 3)}\")\n"
         "print(\"acc / l =\", acc / l)\n"
         "print(\"full computation =\", attnlab.scaled_dot_product_attention(q[None], K, V)[0])"),
    md("## 动手写：在线 softmax\n\n把上面的循环写成函数：q (D,)、K (S, D)、V (S, Dv)，每次读 block 个键，返回 (Dv,)。"
       "最后一块可能不满 block 个键。",
       "## Your turn: the online softmax\n\nTurn the loop above into a function: q (D,), K (S, D), "
       "V (S, Dv), block keys at a time, returning (Dv,). The last tile may hold fewer keys."),
    write("online_attention", "online_attention(q, K, V, block)", "m、l、acc 三个运行量", "the running m, l and acc",
          "    m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])\n"
          "    for start in range(0, len(K), block):\n"
          "        s = K[start:start + block] @ q / np.sqrt(len(q))   # 这一块的分数\n"
          "        m_new = max(m, s.max())\n"
          "        correction = np.exp(m - m_new)                    # 旧的 l、acc 按新的最大值重新缩放\n"
          "        p = np.exp(s - m_new)\n"
          "        l, acc, m = l * correction + p.sum(), acc * correction + p @ V[start:start + block], m_new\n"
          "    return acc / l"),
    code("report.draw(\"flash\", lang=LANG)"),
    md("KV 缓存：解码时每一步只算新词元的 q、k、v，之前的 K、V 存起来复用。",
       "The KV cache: while decoding, each step computes only the new token's q, k, v and "
       "reuses the stored K and V."),
    code("report.draw(\"kvcache\", lang=LANG)"),
    md("## 练习\n\n1. 验证 `attnlab.flash_attention(q, k, v, is_causal=True, block_k=4)` 与 "
       "`attnlab.scaled_dot_product_attention` 一致（差别小于 1e-12）。\n"
       "2. 用 `attnlab.KVCache` 一步一步解码 16 个词元，和一次算完的因果注意力比较。\n"
       "3. 上面的循环里如果不乘 correction，结果会错在哪里？",
       "## Exercises\n\n1. Check that `attnlab.flash_attention(q, k, v, is_causal=True, "
       "block_k=4)` equals `attnlab.scaled_dot_product_attention` (within 1e-12).\n2. Decode "
       "16 tokens step by step with `attnlab.KVCache` and compare with causal attention at once.\n"
       "3. In the loop above, what goes wrong without the correction factor?"),
)

# ----------------------------------------------------------------- debugging checklist
lesson(
    "10_debugging_checklist",
    md("# 第 10 课：调试检查清单（原文 001 第 5 节）\n\n"
       "1. 注意力权重分布是否合理（不应全均匀或过度稀疏）\n2. 梯度范数是否稳定\n3. 各头注意力模式是否多样",
       "# Lesson 10: the debugging checklist (article 001 section 5)\n\n"
       "1. Are the weights reasonable (neither all uniform nor over-sparse)?\n"
       "2. Are the gradient norms stable?\n3. Do the heads attend in diverse ways?"),
    code("from attnlab.lens.diagnostics import diagnose\n"
         "uniform, one_hot = np.full((4, 4), 0.25), np.eye(4)\n"
         "d = diagnose(np.stack([uniform, one_hot, one_hot]))\n"
         "print(report.diagnostics_table(d, LANG))"),
    md("**规则什么时候会误报**：“过度稀疏”并不总是坏事。训练好的模型里有一种很健康的头——"
       "“前一个词元”头（每个词元几乎把全部权重放在前一个词元上），它的每一行都接近 one-hot，"
       "会被“过度稀疏”这条规则标出来。看到这个标记时，先看它关注的是不是一个固定的相对位置，再下结论。\n\n"
       "梯度范数：`bk`（键的偏置）的梯度**恰好为 0**，不是梯度消失：bk 给一行里每个分数加上同一个常数 q·bk，"
       "softmax 对每行加常数不敏感。",
       "**When a rule misfires**: \"over-sparse\" is not always bad. Trained models have a "
       "healthy kind of head, the previous-token head (each token puts nearly all its weight "
       "on the token before it): every row is near one-hot and the over-sparse rule flags "
       "it. When you see the flag, check whether the head attends to a fixed relative "
       "position before concluding.\n\nGradient norms: the gradient of `bk` (the key bias) "
       "is **exactly 0**, not vanishing: bk adds the same constant q·bk to every score of a "
       "row, and the softmax ignores a per-row constant."),
    md("## 动手写：softmax 的梯度\n\ny = softmax(x)，dy = ∂L/∂y，求 dx = ∂L/∂x = y ⊙ (dy − Σ_j dy_j y_j)（每一行求和）。"
       "写完看一看：dx 的每一行之和是多少？这就是 bk 的梯度为 0 的原因。",
       "## Your turn: softmax's gradient\n\ny = softmax(x), dy = ∂L/∂y; compute dx = ∂L/∂x = "
       "y ⊙ (dy − Σ_j dy_j y_j) (summed per row). Then look: what does each row of dx sum to? "
       "That is why bk's gradient is 0."),
    write("softmax_backward", "softmax_backward(y, dy)", "返回 dx，形状同 y", "return dx, shaped like y",
          "    return y * (dy - np.sum(dy * y, axis=-1, keepdims=True))   # 每行之和为 0"),
    code("mha = attnlab.MultiHeadAttention.init(2, 8, seed=0)\n"
         "x = np.random.default_rng(0).standard_normal((5, 8))\n"
         "grads = attnlab.grad_diagnostics.grad_norms(mha, x, dout=np.ones((5, 8)))\n"
         "for name, norm in grads.norms.items():\n    print(f\"{name:4s} {norm:.3g}\")"),
    md("## 练习\n\n1. 构造一个“前一个词元”头的权重矩阵（第 i 行的 1 在第 i−1 列），用 `diagnose` 看它被怎样标记。\n"
       "2. 证明 softmax(s + c) = softmax(s)，从而 bk 的梯度为 0。\n3. 两个完全相同的头，JS 距离是多少？",
       "## Exercises\n\n1. Build a previous-token head (row i has its 1 in column i−1) and "
       "see how `diagnose` flags it.\n2. Prove softmax(s + c) = softmax(s), hence bk's "
       "gradient is 0.\n3. What is the JS distance between two identical heads?"),
)

# ----------------------------------------------------------------- 原文 002
lesson(
    "11_walkthrough",
    md("# 第 11 课：自注意力到底在算什么（原文 002）\n\n"
       "Attention(Q, K, V) = softmax(QKᵀ / √d_k) V：用 Q 去看 K 得到权重，再用权重对 V 加权求和。"
       "原文 002 用同一个 3×4 的 X 和 4×4 的投影。",
       "# Lesson 11: what self-attention computes (article 002)\n\n"
       "Attention(Q, K, V) = softmax(QKᵀ / √d_k) V: Q looks at K for the weights, the "
       "weights sum V. Article 002 uses the same 3×4 X with 4×4 projections."),
    md("## 动手写：原文 002 的整个计算（投影 + 缩放点积注意力）",
       "## Your turn: article 002's whole computation (projections + scaled dot-product attention)"),
    write("self_attention", "self_attention(X, Wq, Wk, Wv)", "原文 002 的几行", "article 002's lines",
          "    Q, K, V = X @ Wq, X @ Wk, X @ Wv\n"
          "    return attnlab.softmax(Q @ K.T / np.sqrt(K.shape[-1])) @ V"),
    code("tokens = [\"小明\", \"去了\", \"学校\"]\n"
         "trace = attnlab.explain(tokens=tokens, d_k=4)\n"
         "w = trace.get(\"weights\").values\n"
         "for i, token in enumerate(tokens):\n"
         "    print(token, \"→\", tokens[int(w[i].argmax())], round(float(w[i].max()), 3))\n"
         "print(report.note_lines(trace, LANG)[0])\n"
         "tops = [tokens[int(attnlab.explain(tokens=tokens, d_k=4, seed=s).get(\"weights\").values[1].argmax())]\n"
         "        for s in range(5)]\n"
         "print(tops)   # 换 5 个随机种子，“去了”最关注的词元各不相同",
         "tokens = [\"小明\", \"去了\", \"学校\"]\n"
         "trace = attnlab.explain(tokens=tokens, d_k=4)\n"
         "w = trace.get(\"weights\").values\n"
         "for i, token in enumerate(tokens):\n"
         "    print(token, \"→\", tokens[int(w[i].argmax())], round(float(w[i].max()), 3))\n"
         "print(report.note_lines(trace, LANG)[0])\n"
         "tops = [tokens[int(attnlab.explain(tokens=tokens, d_k=4, seed=s).get(\"weights\").values[1].argmax())]\n"
         "        for s in range(5)]\n"
         "print(tops)   # over 5 random seeds, 去了 attends most to different tokens"),
    md("**看什么**：这里的权重是随机的，“去了”关注谁没有意义；原文 002 的故事（“去了”更关注“学校”）要靠训练得到的权重。\n\n"
       "**训练过的模型**：`attnlab inspect` 用的 all-MiniLM-L6-v2 是英文模型，它的词表里没有“去”“了”“校”"
       "（会变成 [UNK]），所以“小明 去了 学校”不能在它上面跑；用英文句子。"
       "例句“The animal didn't cross the street because it was too tired.”出自 Google 2017 年介绍 Transformer 的博客和 "
       "Jay Alammar 的《The Illustrated Transformer》，不是原文。在终端运行 `attnlab inspect --find \"it->animal\"`，"
       "会找到把“it”连到“animal”的头；但把 tired 换成 wide（“too wide”时 it 指 street），"
       "第 6 层第 12 个头仍把 0.56 的权重放在 animal 上，第 4 层第 2 个头 0.28（street 只有 0.12）——它们连的是句子的主语名词，而不是 it 真正指代的东西，所以不能叫它们“指代头”。",
       "**What to look at**: the weights here are random, so whom 去了 attends to means "
       "nothing; article 002's story (去了 attending to 学校) needs trained weights.\n\n"
       "**A trained model**: all-MiniLM-L6-v2, used by `attnlab inspect`, is an English "
       "model; its vocabulary lacks 去, 了 and 校 (they become [UNK]), so 小明 去了 学校 cannot "
       "run on it: use English sentences. \"The animal didn't cross the street because it was "
       "too tired.\" comes from Google's 2017 Transformer blog post and Jay Alammar's "
       "Illustrated Transformer, not from the articles. In a terminal, `attnlab inspect --find "
       "\"it->animal\"` finds the heads linking \"it\" to \"animal\"; but swap tired for wide (\"too "
       "wide\": it is the street) and layer 6 head 12 still puts 0.56 on animal, layer 4 head 2 "
       "0.28 (0.12 on street): they link the subject noun, not what \"it\" refers to, so they "
       "are no coreference heads."),
    md("## 练习\n\n1. 原文 002 说自注意力比 RNN 好在“长距离”和“并行”：在 `attnlab.explain` 的哪一步能看出并行？\n"
       "2. 用 `attnlab inspect` 比较 “too tired” 和 “too wide” 两句里 it 的权重。\n"
       "3. 注意力权重大就说明“重要”吗？（Jain & Wallace 2019；Wiegreffe & Pinter 2019；`attnlab lens` 的消融）",
       "## Exercises\n\n1. Article 002 says attention beats RNNs on long range and "
       "parallelism: which step of `attnlab.explain` shows the parallelism?\n2. With `attnlab "
       "inspect`, compare it's weights in \"too tired\" and \"too wide\".\n3. Does a large weight "
       "mean \"important\"? (Jain & Wallace 2019; Wiegreffe & Pinter 2019; ablation in `attnlab lens`.)"),
)


# ----------------------------------------------------------------- a trained model
lesson(
    "12_trained_model",
    md("# 第 12 课：从随机权重到训练好的模型\n\n"
       "前面各课的权重都是随机的。这一课用一个训练好的模型 all-MiniLM-L6-v2（6 层、每层 12 个头、d_k = 32，"
       "随 attnlab 一起离线安装）：同样的 Q Kᵀ / √d_k、softmax、加权求和，只是权重学过了。"
       "它是英文模型：词表里没有“去”“了”“校”，“小明去了学校”会出现 [UNK]，所以这一课用英文句子。",
       "# Lesson 12: from random weights to a trained model\n\n"
       "Every weight so far was random. This lesson uses a trained model, all-MiniLM-L6-v2 "
       "(6 layers of 12 heads, d_k = 32, installed offline with attnlab): the same Q Kᵀ / √d_k, "
       "softmax and weighted sum, with learned weights. It is an English model: its vocabulary "
       "lacks 去, 了 and 校, so 小明去了学校 gets [UNK]; this lesson uses English sentences."),
    code("from attnlab.models import load_minilm\n"
         "model = load_minilm()\n"
         "print(model.tokenize([\"小明去了学校\"])[2][0])   # 去、了、校 都成了 [UNK]\n"
         "TEXT = \"The animal didn't cross the street because it was too tired.\"\n"
         "trace = model.run(TEXT, keep=(\"Q\", \"K\", \"V\", \"weights\"), layers=[3, 5])\n"
         "tokens = trace.tokens\n"
         "it, animal, street = (tokens.index(t) for t in (\"it\", \"animal\", \"street\"))\n"
         "Q, K = trace.get(\"Q\", layer=3, head=1).values, trace.get(\"K\", layer=3, head=1).values   # 第 4 层第 2 个头\n"
         "print(Q.shape, K.shape)                                 # (T, d_k) = (16, 32)\n"
         "print(\"q_it · k_animal / √d_k =\", round(float(Q[it] @ K[animal] / np.sqrt(32)), 3))",
         "from attnlab.models import load_minilm\n"
         "model = load_minilm()\n"
         "print(model.tokenize([\"小明去了学校\"])[2][0])   # 去, 了 and 校 became [UNK]\n"
         "TEXT = \"The animal didn't cross the street because it was too tired.\"\n"
         "trace = model.run(TEXT, keep=(\"Q\", \"K\", \"V\", \"weights\"), layers=[3, 5])\n"
         "tokens = trace.tokens\n"
         "it, animal, street = (tokens.index(t) for t in (\"it\", \"animal\", \"street\"))\n"
         "Q, K = trace.get(\"Q\", layer=3, head=1).values, trace.get(\"K\", layer=3, head=1).values   # layer 4, head 2\n"
         "print(Q.shape, K.shape)                                 # (T, d_k) = (16, 32)\n"
         "print(\"q_it · k_animal / √d_k =\", round(float(Q[it] @ K[animal] / np.sqrt(32)), 3))"),
    md("## 动手写：用你自己的缩放分数算一个真实的头\n\n和第 2 课一样写 `scaled_scores`，下一格用它和 softmax 算出这个头的权重，与模型自己的权重比较。",
       "## Your turn: a real head with your own scaled scores\n\nWrite `scaled_scores` as in "
       "lesson 2; the cell after next uses it with softmax to compute this head's weights and "
       "compares them with the model's own."),
    write("scaled_scores", "scaled_scores(Q, K)", "Q Kᵀ / √d_k", "Q Kᵀ / √d_k",
          "    return Q @ K.T / np.sqrt(K.shape[-1])"),
    code("model_weights = trace.get(\"weights\", layer=3, head=1).values   # (T, T)\n"
         "try:\n"
         "    mine = attnlab.softmax(scaled_scores(Q, K))\n"
         "    print(\"与模型的最大差别:\", float(np.abs(mine - model_weights).max()))\n"
         "except NotImplementedError:\n"
         "    print(\"先写好上面的 scaled_scores\")\n"
         "print(\"it → animal:\", round(float(model_weights[it, animal]), 2))",
         "model_weights = trace.get(\"weights\", layer=3, head=1).values   # (T, T)\n"
         "try:\n"
         "    mine = attnlab.softmax(scaled_scores(Q, K))\n"
         "    print(\"largest difference from the model:\", float(np.abs(mine - model_weights).max()))\n"
         "except NotImplementedError:\n"
         "    print(\"write scaled_scores above first\")\n"
         "print(\"it → animal:\", round(float(model_weights[it, animal]), 2))"),
    md("## 对照句：这个头真的懂“it 指什么”吗？\n\n把 tired 换成 wide：“too wide” 时 it 指的是 street。"
       "如果这个头在做指代消解，it 的权重应该转到 street 上。",
       "## A contrast pair: does this head know what \"it\" means?\n\nSwap tired for wide: with "
       "\"too wide\", it is the street. A head resolving coreference would move it's weight to street."),
    code("for text in (TEXT, TEXT.replace(\"tired\", \"wide\")):\n"
         "    w = model.run(text, keep=(\"weights\",)).attention()   # (L, H, T, T)，全部 6 层\n"
         "    for layer, head in ((3, 1), (5, 11)):\n"
         "        print(text.split()[-1], f\"第 {layer + 1} 层第 {head + 1} 个头:\",\n"
         "              \"animal\", round(float(w[layer, head, it, animal]), 2),\n"
         "              \"street\", round(float(w[layer, head, it, street]), 2))",
         "for text in (TEXT, TEXT.replace(\"tired\", \"wide\")):\n"
         "    w = model.run(text, keep=(\"weights\",)).attention()   # (L, H, T, T), all 6 layers\n"
         "    for layer, head in ((3, 1), (5, 11)):\n"
         "        print(text.split()[-1], f\"layer {layer + 1} head {head + 1}:\",\n"
         "              \"animal\", round(float(w[layer, head, it, animal]), 2),\n"
         "              \"street\", round(float(w[layer, head, it, street]), 2))"),
    md("**看什么**：“too wide” 时两个头仍然更关注 animal——它们连的是句子的主语名词，不是 it 的所指，所以不该叫“指代头”。\n\n"
       "## 注意力停靠点（attention sink）\n\nsoftmax 让每行之和为 1：一个头即使没有什么可读的，也得把权重放在某处。"
       "训练好的模型常把它放在 [CLS]、[SEP] 上（StreamingLLM 称之为 attention sink；注意 d2l 的“注意力汇聚”指加权求和，是另一回事）。",
       "**What to look at**: with \"too wide\" both heads still prefer animal: they link the "
       "subject noun, not what \"it\" refers to, so they are no coreference heads.\n\n"
       "## Attention sinks\n\nThe softmax makes every row sum to 1: a head with nothing to read "
       "must still put its weight somewhere. Trained models often park it on [CLS] and [SEP] "
       "(StreamingLLM calls them attention sinks)."),
    code("w = model.run(TEXT, keep=(\"weights\",)).attention()          # (6, 12, T, T)\n"
         "special = [0, len(tokens) - 1]                               # [CLS]、[SEP]\n"
         "share = w[..., special].sum(-1).mean(-1)                      # (6, 12)：每个头停靠在特殊词元上的平均权重\n"
         "print(np.round(share.mean(-1), 2))                            # 每一层的平均",
         "w = model.run(TEXT, keep=(\"weights\",)).attention()          # (6, 12, T, T)\n"
         "special = [0, len(tokens) - 1]                               # [CLS], [SEP]\n"
         "share = w[..., special].sum(-1).mean(-1)                      # (6, 12): each head's mean weight parked there\n"
         "print(np.round(share.mean(-1), 2))                            # the mean of each layer"),
    md("## 注意力不等于解释\n\n权重大不代表影响大：一个键的值向量很小，权重再大也传不出多少东西"
       "（Jain & Wallace 2019；Wiegreffe & Pinter 2019；Kobayashi 等 2020 用 ‖α v‖ 衡量）。下面比较 it 这一行的权重和 α‖v‖；"
       "要看模型真正依赖什么，用消融：`attnlab lens`。",
       "## Attention is not explanation\n\nA large weight is not a large effect: a key whose "
       "value vector is small passes little however large its weight (Jain & Wallace 2019; "
       "Wiegreffe & Pinter 2019; Kobayashi et al. 2020 measure ‖α v‖). Below, it's row of "
       "weights beside α‖v‖; to see what the model relies on, ablate: `attnlab lens`."),
    code("V = trace.get(\"V\", layer=3, head=1).values                       # (T, d_v)\n"
         "alpha = model_weights[it]\n"
         "effect = alpha * np.linalg.norm(V, axis=-1)\n"
         "for name, row in ((\"α\", alpha), (\"α‖v‖\", effect / effect.sum())):\n"
         "    top = np.argsort(row)[::-1][:3]\n"
         "    print(name, [(tokens[j], round(float(row[j]), 2)) for j in top])"),
    md("## 练习\n\n1. 用 `attnlab inspect --find \"it->animal\"` 在终端里找出把 it 连到 animal 的头，再换一句话试试。\n"
       "2. 哪一层停靠在 [CLS]/[SEP] 上的权重最多？把这些头的输出置零（`attnlab lens` 的消融），句向量变了多少？\n"
       "3. 找一句中文，模型词表里每个字都有（例如“天上有月，水中也有月。”），看第二个“月”关注谁。",
       "## Exercises\n\n1. In a terminal, find the heads linking it to animal with `attnlab "
       "inspect --find \"it->animal\"`, then try another sentence.\n2. Which layer parks most "
       "weight on [CLS]/[SEP]? Ablate those heads (`attnlab lens`): how much does the "
       "sentence vector change?\n3. Take a Chinese sentence whose every character the model "
       "knows (e.g. 天上有月，水中也有月。) and see what the second 月 attends to."),
)


# ----------------------------------------------------------------- watching a model learn
lesson(
    "13_training_sort",
    md("# 第 13 课：看注意力学会排序\n\n"
       "前面的权重要么是随机的，要么是别人训练好的。这一课我们自己训练一个很小的解码器（1 层、2 个头），"
       "让它学排序（minGPT 的演示任务）：先读 4 个 0～4 之间的数字，再按从小到大的顺序把它们输出。"
       "它是自回归的下一个词元预测：输入是序列去掉最后一个，目标是序列去掉第一个，只在答案部分计算损失。\n\n"
       "    提示 3 1 2 1 | 答案 1 1 2 3\n\n"
       "模型要输出下一个数字时，该看哪里？答案就在提示里：**下一个要输出的数字在提示中的位置**。"
       "这就是本课的检测器“关注下一个输出”（next output）。",
       "# Lesson 13: watching attention learn to sort\n\n"
       "Every weight so far was random or trained by someone else. In this lesson we train a "
       "tiny decoder (1 layer, 2 heads) to sort (minGPT's demo task): it reads 4 digits in "
       "0-4, then emits them in increasing order. It is autoregressive next-token prediction: "
       "the input is the sequence without its last token, the target the sequence without its "
       "first, and only the answer is scored.\n\n"
       "    prompt 3 1 2 1 | answer 1 1 2 3\n\n"
       "Where should the model look when it is about to emit the next digit? The answer is in "
       "the prompt: **where the digit it emits next sits in the prompt**. That is this lesson's "
       "detector, \"attends to the next output\"."),
    code("import torch\n"
         "from attnlab.train.tasks import IGNORE, make_task\n"
         "from attnlab.train import DecoderConfig, TrainConfig, next_output_scores, train\n"
         "torch.set_num_threads(1)                      # 单线程：同一个种子，每次的数字完全一样\n"
         "task = make_task(\"sort\", length=4, digits=5, heldout=200)\n"
         "inputs, targets = task.heldout_inputs[:1], task.heldout_targets[:1]\n"
         "print(\"输入:\", inputs[0].tolist())            # (T,) = (7,)：4 个提示数字 + 前 3 个答案\n"
         "print(\"目标:\", targets[0].tolist())           # -1 (IGNORE) 表示这个位置不计损失\n"
         "print(\"提示长度:\", task.answer_start + 1)",
         "import torch\n"
         "from attnlab.train.tasks import IGNORE, make_task\n"
         "from attnlab.train import DecoderConfig, TrainConfig, next_output_scores, train\n"
         "torch.set_num_threads(1)                      # one thread: the same seed gives the same numbers\n"
         "task = make_task(\"sort\", length=4, digits=5, heldout=200)\n"
         "inputs, targets = task.heldout_inputs[:1], task.heldout_targets[:1]\n"
         "print(\"inputs: \", inputs[0].tolist())         # (T,) = (7,): 4 prompt digits + the first 3 answers\n"
         "print(\"targets:\", targets[0].tolist())        # -1 (IGNORE): this position is not scored\n"
         "print(\"prompt length:\", task.answer_start + 1)"),
    md("## 检测器的定义\n\n在每个计分位置 t，模型接下来要输出 targets[t]。一个头在这里的得分是它放在提示中**值等于 targets[t] 的那些位置**上的权重之和"
       "（数字重复时，每一份拷贝都算）；再对所有计分位置、所有样本取平均。"
       "只看着下一个输出的头得 1 分；把权重平均分给能看到的 t + 1 个位置（因果掩蔽）的头，得分约为 1/(t + 1) 乘以这个数字在提示里出现的次数。"
       "先用一个手工构造的权重验证这两点。",
       "## The detector, precisely\n\nAt a scored position t the model is about to emit "
       "targets[t]. A head's score there is the weight it puts on the prompt positions **whose "
       "value is targets[t]** (every copy, when the digit repeats), averaged over every scored "
       "position of every example. A head that looks only at the next output scores 1; one "
       "that spreads its weight evenly over the t + 1 positions it may see (causal masking) "
       "scores about 1/(t + 1) times how often the digit is in the prompt. First, check both "
       "on hand-built weights."),
    code("T, P = task.seq_len, task.answer_start + 1\n"
         "exact = np.eye(T)                               # 不计分的行：看自己\n"
         "for t in range(task.answer_start, T):\n"
         "    exact[t] = 0.0\n"
         "    exact[t, list(inputs[0, :P]).index(targets[0, t])] = 1.0   # 提示中下一个输出所在的位置\n"
         "uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]   # 因果掩蔽下的平均注意力\n"
         "for name, w in ((\"只看下一个输出\", exact), (\"平均分配\", uniform)):\n"
         "    score = next_output_scores(w[None, None, None], inputs, targets, P)   # (B, L, H, T, T) -> (L, H)\n"
         "    print(name, round(float(score[0, 0]), 3))",
         "T, P = task.seq_len, task.answer_start + 1\n"
         "exact = np.eye(T)                               # rows that are not scored: on themselves\n"
         "for t in range(task.answer_start, T):\n"
         "    exact[t] = 0.0\n"
         "    exact[t, list(inputs[0, :P]).index(targets[0, t])] = 1.0   # where the next output sits in the prompt\n"
         "uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]   # even attention under the causal mask\n"
         "for name, w in ((\"on the next output\", exact), (\"uniform\", uniform)):\n"
         "    score = next_output_scores(w[None, None, None], inputs, targets, P)   # (B, L, H, T, T) -> (L, H)\n"
         "    print(name, round(float(score[0, 0]), 3))"),
    md("## 训练\n\n200 步，每 20 步在同一批 100 个留出样本上拍一张“快照”：记下注意力权重，并给每个头打分。在 CPU 上大约十几秒。",
       "## Training\n\n200 steps; every 20 steps a snapshot on the same 100 held-out examples "
       "records the attention weights and scores every head. About ten seconds on a CPU."),
    code("model_config = DecoderConfig(task.vocab_size, task.seq_len, d_model=32, num_heads=2, num_layers=1)\n"
         "result = train(task, model_config, TrainConfig(steps=200, batch_size=64, snapshots=11,\n"
         "                                               snapshot_batch=100, seed=0))\n"
         "history = result.head_history[\"next_output\"]     # (K, L, H)：K 张快照\n"
         "baseline = result.metrics()[\"next_output_uniform\"]\n"
         "for step, scores, loss in zip(result.snapshot_steps, history, result.heldout_loss):\n"
         "    print(f\"第 {step:3d} 步  留出集损失 {loss:.3f}  各头得分 {np.round(scores[0], 2).tolist()}\")\n"
         "print(\"平均注意力的得分:\", round(baseline, 3), \" 留出集完全正确率:\", round(result.evaluation.accuracy, 3))\n"
         "assert history[-1].max() > 2 * baseline      # 训练后至少有一个头明显在看下一个输出",
         "model_config = DecoderConfig(task.vocab_size, task.seq_len, d_model=32, num_heads=2, num_layers=1)\n"
         "result = train(task, model_config, TrainConfig(steps=200, batch_size=64, snapshots=11,\n"
         "                                               snapshot_batch=100, seed=0))\n"
         "history = result.head_history[\"next_output\"]     # (K, L, H): K snapshots\n"
         "baseline = result.metrics()[\"next_output_uniform\"]\n"
         "for step, scores, loss in zip(result.snapshot_steps, history, result.heldout_loss):\n"
         "    print(f\"step {step:3d}  held-out loss {loss:.3f}  head scores {np.round(scores[0], 2).tolist()}\")\n"
         "print(\"uniform attention scores:\", round(baseline, 3), \" held-out exact match:\", round(result.evaluation.accuracy, 3))\n"
         "assert history[-1].max() > 2 * baseline      # after training, some head clearly looks at the next output"),
    code("from attnlab.report.training import plot_training\n"
         "shown = {\"next_output\": history}                # 只画适合排序的检测器\n"
         "plot_training(result.losses, result.snapshot_steps, shown, heldout_loss=result.heldout_loss, lang=LANG);",
         "from attnlab.report.training import plot_training\n"
         "shown = {\"next_output\": history}                # only the detector that fits sorting\n"
         "plot_training(result.losses, result.snapshot_steps, shown, heldout_loss=result.heldout_loss, lang=LANG);"),
    md("**看什么**：第 0 步（训练前）各头的得分接近平均注意力的得分；损失下降的同时，得分很快升高。"
       "前一个词、归纳这些检测器在排序上什么也说明不了：排序头要找的是下一个数字，不管它在提示的哪个位置，"
       "所以 `attnlab train sort` 只报告“下一个输出”，其余得分留在 metrics.json 里。\n\n"
       "## 怎样读训练页面\n\n`attnlab train sort --out sort/` 会写出 `sort/view.html`（下面一格在临时目录里生成同样的页面）。用浏览器打开：\n\n"
       "- **步数滑块**：拖动它（或按“播放”）在快照之间切换；热力图和得分表都换成那一步的。\n"
       "- **层、头**：选一个头。热力图的行是查询（正在输出的位置），列是键；对角线以上是空的，因为因果掩蔽不许看后面。\n"
       "- **得分表**：这一步每个头的“下一个输出”得分。找到得分最高的头，拖回第 0 步再拖到最后，看它的答案行怎样从均匀变成只亮一格——亮的那一格就是下一个要输出的数字。\n"
       "- **留出集损失**随滑块一起显示；虚线格只对归纳任务有意义，排序页面上没有。",
       "**What to look at**: at step 0 (before training) the scores sit near the uniform "
       "score; as the loss falls they rise fast. Previous-token and induction detectors say "
       "nothing on sorting: a sorting head looks for the next digit wherever it sits in the "
       "prompt, so `attnlab train sort` reports only the next-output score and keeps the "
       "others in metrics.json.\n\n"
       "## Reading the training page\n\n`attnlab train sort --out sort/` writes "
       "`sort/view.html` (the next cell writes the same page to a temporary folder). Open it "
       "in a browser:\n\n"
       "- **The step slider**: drag it (or press play) to move between snapshots; the heatmap "
       "and the score table follow.\n"
       "- **Layer, head**: choose a head. Rows of the heatmap are queries (the position "
       "emitting), columns keys; above the diagonal is empty, since the causal mask forbids "
       "looking ahead.\n"
       "- **The score table**: every head's next-output score at this step. Take the best "
       "head, drag back to step 0 and forward to the end, and watch its answer rows go from "
       "even to one bright cell: the bright cell is the digit emitted next.\n"
       "- **The held-out loss** follows the slider; the dashed cells mean something only on "
       "the induction task, and the sort page has none."),
    code("import tempfile\n"
         "from pathlib import Path\n"
         "from attnlab.report.training import training_html\n"
         "labels = [task.labels[int(t)] for t in result.snapshot_tokens]   # 第一个留出样本的词元\n"
         "page = training_html(result.snapshots, result.snapshot_steps, labels, head_history=shown,\n"
         "                     heldout_loss=result.heldout_loss, lang=LANG)\n"
         "path = Path(tempfile.mkdtemp()) / \"view.html\"\n"
         "path.write_text(page, encoding=\"utf-8\")\n"
         "print(\"用浏览器打开:\", path.name, \"（在\", path.parent, \"中）\")",
         "import tempfile\n"
         "from pathlib import Path\n"
         "from attnlab.report.training import training_html\n"
         "labels = [task.labels[int(t)] for t in result.snapshot_tokens]   # the first held-out example's tokens\n"
         "page = training_html(result.snapshots, result.snapshot_steps, labels, head_history=shown,\n"
         "                     heldout_loss=result.heldout_loss, lang=LANG)\n"
         "path = Path(tempfile.mkdtemp()) / \"view.html\"\n"
         "path.write_text(page, encoding=\"utf-8\")\n"
         "print(\"open in a browser:\", path.name, \"(in\", path.parent, \")\")"),
    md("## 动手写：因果掩蔽\n\n这个解码器看不到后面的词元。写出 (T, T) 的布尔矩阵，**True 表示可以关注**；下一格用它检查训练好的权重在被掩蔽的位置上是否都是 0。",
       "## Your turn: the causal mask\n\nThis decoder cannot see later tokens. Return the (T, "
       "T) boolean matrix, **True = may attend**; the cell after next uses it to check that "
       "the trained weights are 0 wherever it blocks."),
    write("causal_mask", "causal_mask(T)", "True = 可以关注", "True = may attend",
          "    return np.tril(np.ones((T, T), dtype=bool))   # 对角线及以下可以关注"),
    code("last = result.snapshots[-1]                      # (L, H, T, T)：最后一张快照\n"
         "try:\n"
         "    blocked = ~causal_mask(task.seq_len)\n"
         "    print(\"被掩蔽位置上的最大权重:\", float(last[..., blocked].max()))\n"
         "except NotImplementedError:\n"
         "    print(\"先写好上面的 causal_mask\")",
         "last = result.snapshots[-1]                      # (L, H, T, T): the last snapshot\n"
         "try:\n"
         "    blocked = ~causal_mask(task.seq_len)\n"
         "    print(\"largest weight where the mask blocks:\", float(last[..., blocked].max()))\n"
         "except NotImplementedError:\n"
         "    print(\"write causal_mask above first\")"),
    md("## 练习\n\n1. 两个头的得分不一样高。把得分高的那个头在第 0 步和最后一步的热力图画出来（`result.snapshots[k, 0, head]`），答案行亮的是哪一格？\n"
       "2. 把 `digits` 改成 3（数字重复得更多）：平均注意力的得分怎么变？为什么检测器要把每一份拷贝都算上？\n"
       "3. 用 `attnlab train reverse` 训练倒序任务：“下一个输出”的定义还合适吗？倒序头应该看哪里（提示：只看位置，不看数值）？\n"
       "4. 把层数改成 2、头数改成 1：最好的头出现在哪一层？",
       "## Exercises\n\n1. The two heads do not score the same. Draw the better head's heatmap "
       "at step 0 and at the last step (`result.snapshots[k, 0, head]`): which cell of an "
       "answer row lights up?\n2. Set `digits` to 3 (more repeats): how does the uniform score "
       "change? Why does the detector count every copy?\n3. Train reverse with `attnlab "
       "train reverse`: does the next-output definition still fit? Where should a reversing "
       "head look (hint: by position, not by value)?\n4. Use 2 layers of 1 head: in which "
       "layer is the best head?"),
)


# ----------------------------------------------------------------- a decoder
BUILD = """import tempfile
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
import attnlab.hf
from attnlab.lens import run_with_cache
from attnlab.models.loading import minilm_path
transformers.utils.logging.disable_progress_bar()

tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))   # {tok}
torch.manual_seed(0)
config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                     bos_token_id=None, eos_token_id=None)
folder = tempfile.mkdtemp()
LlamaForCausalLM(config).save_pretrained(folder)   # {save}
attnlab.hf.register()                              # attn_implementation="attnlab"
model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="attnlab").eval()
print(model.config.num_attention_heads, model.config.num_key_value_heads)   # 4 2"""

PATTERN = """inputs = tokenizer("the cat sat on the mat", return_tensors="pt", add_special_tokens=False)
tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
with torch.no_grad():
    out, cache = run_with_cache(model, **inputs, names=["blocks.0.attn.hook_pattern"])
pattern = cache["blocks.0.attn.hook_pattern"][0].numpy()            # (H, T, T) = (4, 6, 6)
T = len(tokens)
allowed = np.tril(np.ones((T, T), dtype=bool))                      # {allowed}
print(pattern.shape, "{blocked}", float(pattern[:, ~allowed].max()))
print("{rows}", pattern[0].sum(-1).round(6))
report.plot_attention(pattern[0], tokens, tokens, allowed=allowed, lang=LANG)"""

KV = """from transformers import DynamicCache
kv_cache = DynamicCache(config=model.config)
ids = inputs["input_ids"]
with torch.no_grad():
    for t in range(ids.shape[1]):                                    # {one}
        step = model(input_ids=ids[:, t:t + 1], cache=kv_cache, use_cache=True)
        print(t, tokens[t], tuple(kv_cache.layers[0].keys.shape))    # (B, Hkv, S, D)
gap = float((step.logits[0, -1] - out.logits[0, -1]).abs().max())
print("{gap}", gap)
assert gap < 1e-4   # {why}"""

SINK_CHECK = """rng = np.random.default_rng(0)
Q, K, V = rng.standard_normal((4, 8)), rng.standard_normal((5, 8)), rng.standard_normal((5, 3))
sink = 1.0
reference, weights = attnlab.scaled_dot_product_attention(
    Q[None], K[None], V[None], sinks=np.array([sink]), return_weights=True)   # (1, T, Dv), (1, T, S)
print("{rows}", weights[0].sum(-1).round(3))
try:
    print("{gap}", float(np.abs(attention_with_sink(Q, K, V, sink) - reference[0]).max()))
except NotImplementedError:
    print("{first}")"""


def _fill(template: str, **words: str) -> str:
    """A code template with its ``{name}`` comments and strings in one language."""
    return re.sub(r"\{(\w+)\}", lambda m: words[m.group(1)], template)


lesson(
    "14_decoder",
    md("# 第 14 课：解码器——因果掩蔽、KV 缓存和注意力停靠点\n\n"
       "第 12 课的 MiniLM 是编码器：每个词元可以看整句话。GPT、Llama 这类解码器只让每个词元看它自己和前面的词元（因果掩蔽，第 6 课），"
       "逐个生成词元时再用 KV 缓存省掉重复计算。这一课用 transformers 的 `LlamaConfig` 搭一个很小的随机 Llama："
       "2 层，4 个查询头共享 2 组键/值头（GQA），位置编码用 RoPE；分词器借用 MiniLM 的，所以什么都不用下载。"
       "`attnlab.hf.register()` 之后，`attn_implementation=\"attnlab\"` 让模型的每一层注意力都跑在 attnlab 上。",
       "# Lesson 14: a decoder: the causal mask, the KV cache and attention sinks\n\n"
       "Lesson 12's MiniLM is an encoder: every token sees the whole sentence. Decoders such as "
       "GPT and Llama let a token see only itself and the tokens before it (the causal mask, "
       "lesson 6), and generate one token at a time with a KV cache. This lesson builds a tiny "
       "random Llama from transformers' `LlamaConfig`: 2 layers, 4 query heads sharing 2 "
       "key/value heads (GQA), RoPE positions, MiniLM's tokenizer, nothing downloaded. After "
       "`attnlab.hf.register()`, `attn_implementation=\"attnlab\"` runs every attention layer "
       "on attnlab."),
    code(_fill(BUILD, tok="借用 MiniLM 的分词器（随 attnlab 离线安装）",
               save="随机权重，存成和下载来的模型一样的文件夹"),
         _fill(BUILD, tok="MiniLM's tokenizer (installed offline with attnlab)",
               save="random weights, saved as a downloaded model's folder")),
    md("## 因果掩蔽：每个词元只看前面\n\n`run_with_cache` 取出第 1 层（`blocks.0`）的 `hook_pattern`，形状 (H, T, T)。"
       "对角线以上是不允许关注的位置（下图的灰色斜线），那里的权重必须是 0；每一行仍然和为 1。"
       "随机初始化的模型分数都很小，所以第 i 行几乎是均匀的 1/(i+1)：第一个词元只能看自己，权重为 1。",
       "## The causal mask: each token looks back only\n\n`run_with_cache` takes layer 1's "
       "(`blocks.0`) `hook_pattern`, shape (H, T, T). Above the diagonal are the positions a "
       "query may not attend to (hatched grey below): their weights must be 0, and every row "
       "still sums to 1. A random model's scores are small, so row i is nearly uniform, "
       "1/(i+1): the first token can only look at itself, with weight 1."),
    code(_fill(PATTERN, allowed="True = 可以关注（attnlab 的掩码约定）", blocked="被禁止位置上的最大权重：",
               rows="每行之和："),
         _fill(PATTERN, allowed="True = may attend (attnlab's mask convention)",
               blocked="largest weight on a blocked position:", rows="row sums:")),
    md("## KV 缓存：一次一个词元\n\n生成时每一步只送入一个新词元；前面词元的 K、V 已经在缓存里，不必重算。"
       "缓存中键的形状是 (B, Hkv, S, D)：S 每一步加 1；Hkv = 2 而不是 4，因为 GQA 里 4 个查询头共用 2 组键值，缓存小了一半。"
       "逐个词元算到最后一步，得到的 logits 和一次算整句时的最后一行相同（只差浮点舍入）。",
       "## The KV cache: one token at a time\n\nWhen generating, each step feeds one new "
       "token; the earlier tokens' K and V are already in the cache. The cached keys are "
       "(B, Hkv, S, D): S grows by 1 each step; Hkv is 2, not 4, because GQA's 4 query heads "
       "share 2 key/value heads, which halves the cache. After the last step the logits equal "
       "the last row of the whole sentence computed at once (up to rounding)."),
    code(_fill(KV, one="每一步只送入第 t 个词元", gap="与一次算整句的最后一行相比，最大差别：",
               why="float32 舍入；缓存算错的话差别是 logits 本身的量级"),
         _fill(KV, one="each step feeds token t only", gap="largest gap from the whole-sentence row:",
               why="float32 rounding; a wrong cache would be off by the logits' own size")),
    md("## 注意力停靠点（sink），GPT-OSS 的做法\n\n第 12 课看到训练好的模型常把多余的权重停靠在 [CLS]、[SEP] 上。"
       "GPT-OSS 给每个头学一个专门的 sink logit：它作为 softmax 的多一列参与归一化，但没有值向量，"
       "所以每一行的权重之和小于 1——一个头没什么可读时，可以把权重交给 sink，而不必硬塞给某个词元。"
       "attnlab 的 `scaled_dot_product_attention(..., sinks=)` 就是 Hugging Face 中 GPT-OSS eager 实现的算法。\n\n"
       "## 动手写：带 sink 的注意力\n\n先算缩放分数，每行的最大值 m 要把 sink 也算进去，"
       "权重 = exp(分数 − m) / (Σ exp(分数 − m) + exp(sink − m))，输出 = 权重 @ V。",
       "## Attention sinks, the GPT-OSS way\n\nLesson 12 showed trained models parking spare "
       "weight on [CLS] and [SEP]. GPT-OSS learns one sink logit per head instead: it joins "
       "the softmax as one more column but has no value vector, so each row's weights sum to "
       "less than 1: a head with nothing to read hands weight to the sink rather than to some "
       "token. attnlab's `scaled_dot_product_attention(..., sinks=)` is Hugging Face's GPT-OSS "
       "eager attention.\n\n## Your turn: attention with a sink\n\nScale the scores; take each "
       "row's max m over the scores and the sink together; weights = exp(scores − m) / "
       "(Σ exp(scores − m) + exp(sink − m)); output = weights @ V."),
    write("attention_with_sink", "attention_with_sink(Q, K, V, sink)", "返回 (T, Dv)", "return (T, Dv)",
          "    scores = Q @ K.T / np.sqrt(K.shape[-1])                      # (T, S)\n"
          "    m = np.maximum(scores.max(axis=-1, keepdims=True), sink)    # (T, 1)：sink 也参与取最大值\n"
          "    e = np.exp(scores - m)                                      # (T, S)\n"
          "    return e / (e.sum(axis=-1, keepdims=True) + np.exp(sink - m)) @ V   # (T, Dv)"),
    code(_fill(SINK_CHECK, rows="每行权重之和（小于 1）：", gap="与 attnlab 的最大差别：",
               first="先写好上面的 attention_with_sink"),
         _fill(SINK_CHECK, rows="row sums of the weights (under 1):", gap="largest gap from attnlab:",
               first="write attention_with_sink above first")),
    md("## 练习\n\n1. 把 sink 换成 -100 和 +10：每行权重之和分别变成多少？哪种情况下输出接近 0？\n"
       "2. 把 `names` 换成 `[\"blocks.1.attn.hook_pattern\"]`，第 2 层的模式还是因果的吗？为什么不同的层掩码相同？\n"
       "3. 如果是普通的多头注意力（`num_key_value_heads=4`），缓存的形状是什么？1000 个词元、32 层时 GQA 省下多少个数？",
       "## Exercises\n\n1. Set the sink to -100 and to +10: what do the row sums become? When "
       "is the output close to 0?\n2. Change `names` to `[\"blocks.1.attn.hook_pattern\"]`: is "
       "layer 2's pattern causal too? Why is the mask the same in every layer?\n3. With plain "
       "multi-head attention (`num_key_value_heads=4`), what shape is the cache? How many "
       "numbers does GQA save at 1000 tokens and 32 layers?"),
)


def check_cell(name: str, *, solution: bool) -> str:
    if solution:  # the solution notebook proves its answer passes
        return (f"result = exercises.check(\"{name}\", {name}, lang=LANG)\n"
                "assert result.passed, result.hint\nresult")
    return f"exercises.check(\"{name}\", {name}, lang=LANG)"


def notebook(stem: str, cells: list[tuple[str, object]], lang: str, *, solution: bool = False
             ) -> dict:
    out: list[dict] = []

    def add(kind: str, text: str) -> None:
        cell: dict = {"cell_type": kind, "id": f"{stem}-{len(out)}", "metadata": {},
                      "source": _lines(text)}
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        out.append(cell)

    if solution:
        title = {"zh": f"# 参考答案：{stem}\n\n每个答案之后的检查必须通过（`assert result.passed`）。",
                 "en": f"# Solutions: {stem}\n\nThe check after each answer must pass "
                       "(`assert result.passed`)."}[lang]
        add("markdown", title)
        add("code", cells[0][1][lang])  # type: ignore[index]
    for kind, content in cells if not solution else cells[1:]:
        if kind == "exercise":
            assert isinstance(content, Exercise)
            add("code", (content.solution if solution else content.stub)[lang])
            add("code", check_cell(content.name, solution=solution))
        elif not solution:
            add("markdown" if kind == "md" else "code", content[lang])  # type: ignore[index]
    return {"cells": out, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}}


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def _write(path: Path, book: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(book, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    for lang in ("zh", "en"):
        for stem, cells in LESSONS:
            _write(ROOT / lang / f"{stem}.ipynb", notebook(stem, cells, lang))
            if any(kind == "exercise" for kind, _ in cells):
                _write(ROOT / lang / "solutions" / f"{stem}.ipynb",
                       notebook(stem, cells, lang, solution=True))


if __name__ == "__main__":
    main()
