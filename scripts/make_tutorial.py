# ruff: noqa: E501  (lesson text: a sentence reads best on one line)
"""Write the tutorial notebooks, docs/tutorial/zh/*.ipynb and docs/tutorial/en/*.ipynb.

One lesson per section of the three seed articles; the code cells are the same in both
languages, the text is not. Each lesson: what to run, what to look at, an exercise and
its expected result (checked by an ``assert``, so running the notebook checks it).
tests/tutorial executes every notebook. Run ``python scripts/make_tutorial.py`` after
editing a lesson here; the notebooks are written without outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "docs" / "tutorial"

SETUP = """%matplotlib inline
import numpy as np
import attnlab
from attnlab import report
np.set_printoptions(precision=4, suppress=True)
LANG = "{lang}"   # the language of attnlab's text and plots: zh or en"""

# A lesson: (file stem, [(kind, text)]); kind "md" takes {"zh": ..., "en": ...}, "code" a str.
LESSONS: list[tuple[str, list[tuple[str, object]]]] = []


def lesson(stem: str, *cells: tuple[str, object]) -> None:
    LESSONS.append((stem, [("code", SETUP), *cells]))


def md(zh: str, en: str) -> tuple[str, object]:
    return ("md", {"zh": zh, "en": en})


def code(text: str) -> tuple[str, object]:
    return ("code", text)


# ----------------------------------------------------------------- seed 000, steps 1-2
lesson(
    "01_qkv",
    md("# 第 1 课：从输入到 Q、K、V（种子文章 000，第 1–2 节）\n\n"
       "输入 X 有 3 个单词（词元），每个 4 维。三个权重矩阵 Wq、Wk、Wv（4×3）把 X 投影成"
       "查询 Q（我要找什么）、键 K（我能被什么找到）、值 V（我被关注时传出去的内容）。",
       "# Lesson 1: from the input to Q, K, V (seed 000, sections 1–2)\n\n"
       "The input X holds 3 words (tokens) of 4 dims. Three weight matrices Wq, Wk, Wv "
       "(4×3) project X into queries Q (what I look for), keys K (what I can be found by) "
       "and values V (what I pass on when attended to)."),
    code("trace = attnlab.explain()          # seed 000's X, random Wq, Wk, Wv from seed 0\n"
         "X, Wq = trace.get(\"X\").values, trace.get(\"Wq\").values\n"
         "Q = trace.get(\"Q\").values\n"
         "print(X)\nprint(Q)"),
    md("**看什么**：Q 的每一行对应 X 的一行；形状 (3, 4)·(4, 3) = (3, 3)。",
       "**What to look at**: each row of Q belongs to one row of X; shapes (3, 4)·(4, 3) = (3, 3)."),
    md("**练习**：自己用 NumPy 计算 `X @ Wq`，再换一个 `seed` 看看 Q 是否改变。\n\n"
       "**预期结果**：`X @ Wq` 与 trace 中的 Q 完全相同；换了 seed，Q 就不同（权重是随机的）。",
       "**Exercise**: compute `X @ Wq` yourself with NumPy, then change `seed` and see "
       "whether Q changes.\n\n**Expected result**: `X @ Wq` equals the trace's Q exactly; "
       "another seed gives another Q (the weights are random)."),
    code("assert np.array_equal(X @ Wq, Q)\n"
         "other = attnlab.explain(seed=1).get(\"Q\").values\n"
         "assert not np.allclose(other, Q)\n"
         "print(\"ok\")"),
)

# ----------------------------------------------------------------- seed 000, step 3
lesson(
    "02_scores_scaling_softmax",
    md("# 第 2 课：注意力分数、缩放、softmax（种子文章 000，第 3 节）\n\n"
       "注意力分数 = Q·Kᵀ；缩放：除以 √d_k；softmax 把每一行变成和为 1 的注意力权重。",
       "# Lesson 2: scores, scaling, softmax (seed 000, section 3)\n\n"
       "Scores = Q·Kᵀ; scaling: divide by √d_k; softmax turns each row into attention "
       "weights that sum to 1."),
    code("trace = attnlab.explain()\n"
         "for key in (\"scores\", \"scaled\", \"weights\"):\n"
         "    step = trace.get(key)\n"
         "    print(report.step_title(step, LANG), step.formula)\n"
         "    print(step.values)\n"
         "print(trace.get(\"weights\").values.sum(axis=1))"),
    md("**看什么**：每一行权重之和为 1；缩放后的分数更接近 0，所以权重没那么极端。",
       "**What to look at**: each weights row sums to 1; the scaled scores are closer to 0, "
       "so the weights are less extreme."),
    md("**练习**：关掉缩放（`scale=1.0`，命令行 `attnlab explain --no-scale`），再试种子文章 000 的"
       "softmax 遇到很大的输入：`X = [[100,0,100,0],[0,2,0,2],[1,1,1,1]]`。\n\n"
       "**预期结果**：不缩放时每行最大权重只会更大；大输入下 softmax 饱和（提示里写明），"
       "而没有减去最大值的朴素 softmax 在 seed 3 上得到 NaN。",
       "**Exercise**: switch scaling off (`scale=1.0`, on the command line `attnlab explain "
       "--no-scale`), then give seed 000's softmax a large input: `X = [[100,0,100,0],"
       "[0,2,0,2],[1,1,1,1]]`.\n\n**Expected result**: without scaling each row's largest "
       "weight only grows; with the large input the softmax saturates (the notes say so), "
       "and the naive softmax without the max subtracted gives NaN at seed 3."),
    code("raw = attnlab.explain(scale=1.0)\n"
         "assert (raw.weights().max(-1) >= trace.weights().max(-1) - 1e-12).all()\n"
         "big = attnlab.explain(X=[[100, 0, 100, 0], [0, 2, 0, 2], [1, 1, 1, 1]], seed=3)\n"
         "kinds = [n[\"kind\"] for n in big.meta[\"notes\"]]\n"
         "assert \"saturated\" in kinds and \"naive_overflow\" in kinds\n"
         "s = big.get(\"scaled\").values\n"
         "with np.errstate(all=\"ignore\"):\n"
         "    naive = np.exp(s) / np.sum(np.exp(s), axis=1, keepdims=True)   # seed 000's line\n"
         "print(naive)\n"
         "print(big.get(\"weights\").values)"),
)

# ----------------------------------------------------------------- seed 000, steps 4-5
lesson(
    "03_weighted_sum",
    md("# 第 3 课：加权求和与完整的函数（种子文章 000，第 4–5 节）\n\n"
       "输出的第 i 行 = 用第 i 行注意力权重对 V 的各行加权求和。"
       "`attnlab.self_attention(X, Wq, Wk, Wv)` 就是种子文章 000 的 `self_attention`。",
       "# Lesson 3: the weighted sum and the whole function (seed 000, sections 4–5)\n\n"
       "Row i of the output = the rows of V summed with row i's attention weights. "
       "`attnlab.self_attention(X, Wq, Wk, Wv)` is seed 000's `self_attention`."),
    code("trace = attnlab.explain()\n"
         "X, Wq, Wk, Wv = (trace.get(k).values for k in (\"X\", \"Wq\", \"Wk\", \"Wv\"))\n"
         "weights, V = trace.get(\"weights\").values, trace.get(\"V\").values\n"
         "out = attnlab.self_attention(X, Wq, Wk, Wv)\nprint(out)"),
    md("**看什么**：常见问题排查（种子文章 000）：维度不匹配时，attnlab 会说出是哪个参数、"
       "期望什么、实际得到什么。",
       "**What to look at**: seed 000's troubleshooting list: on a shape mismatch attnlab "
       "names the argument, what it expected and what it got."),
    code("try:\n    attnlab.self_attention(X, Wq[:3], Wk, Wv)\n"
         "except attnlab.AttnlabError as error:\n    print(error)"),
    md("**练习**：用权重手算输出的第一行。\n\n**预期结果**：`weights[0] @ V` 等于 `out[0]`。",
       "**Exercise**: compute the output's first row from the weights by hand.\n\n"
       "**Expected result**: `weights[0] @ V` equals `out[0]`."),
    code("assert np.allclose(weights[0] @ V, out[0])\nprint(\"ok\")"),
)

# ----------------------------------------------------------------- seed 000, step 6
lesson(
    "04_heatmap",
    md("# 第 4 课：把中间结果画出来（种子文章 000，第 6 节）\n\n"
       "行是查询（Query），列是键（Key）。attnlab 把注意力分数、缩放后的分数和注意力权重并排画出。",
       "# Lesson 4: drawing the intermediates (seed 000, section 6)\n\n"
       "Rows are queries, columns keys. attnlab draws the scores, the scaled scores and the "
       "weights side by side."),
    code("trace = attnlab.explain(tokens=[\"小明\", \"去了\", \"学校\"], is_causal=True)\n"
         "report.plot(trace, lang=LANG)"),
    md("**看什么**：因果掩码下，右上方被屏蔽的格子画成灰色斜线，而不是写 0.00：它的权重为 0 是"
       "因为掩码，不是因为分数小。\n\n**练习**：数一数被屏蔽的格子。\n\n"
       "**预期结果**：3 个词元的因果掩码屏蔽 3 个格子（对角线以上）。",
       "**What to look at**: under the causal mask the blocked cells top right are grey and "
       "hatched, not written 0.00: their weight is 0 because of the mask, not the scores.\n\n"
       "**Exercise**: count the blocked cells.\n\n**Expected result**: a causal mask over 3 "
       "tokens blocks 3 cells (above the diagonal)."),
    code("blocked = np.isneginf(trace.get(\"masked\").values)\n"
         "assert blocked.sum() == 3 and np.array_equal(blocked, np.triu(np.ones((3, 3), bool), 1))\n"
         "print(blocked)"),
)

# ----------------------------------------------------------------- multi-head
lesson(
    "05_multi_head",
    md("# 第 5 课：多头注意力（种子文章 000 第 7 节，种子文章 001 第 2 节）\n\n"
       "种子文章 000 给每个头各自的 Wq、Wk、Wv，再拼接；种子文章 001 先做一次 d_model 宽的投影，"
       "再 `.view(T, h, d_k).transpose` 拆成 h 个头。两者是同一个计算。",
       "# Lesson 5: multi-head attention (seed 000 section 7, seed 001 section 2)\n\n"
       "Seed 000 gives each head its own Wq, Wk, Wv and concatenates; seed 001 projects "
       "once to d_model and splits into h heads with `.view(T, h, d_k).transpose`. They "
       "are the same computation."),
    code("X = np.random.default_rng(0).standard_normal((4, 8))\n"
         "a = attnlab.explain(X, num_heads=2, d_k=4, split=\"seed000\", seed=1)\n"
         "b = attnlab.explain(X, num_heads=2, split=\"seed001\", seed=1)\n"
         "print(b.get(\"Q\", head=1).formula)\n"
         "report.plot(b, lang=LANG)"),
    md("**练习**：比较两种拆分的注意力权重和拼接后的输出。\n\n"
       "**预期结果**：完全一致（差别只在浮点舍入，小于 1e-12）。",
       "**Exercise**: compare the two layouts' weights and concatenated outputs.\n\n"
       "**Expected result**: the same (up to float rounding, below 1e-12)."),
    code("assert np.allclose(a.weights(), b.weights(), atol=1e-12)\n"
         "assert np.allclose(a.output, b.output, atol=1e-12)\n"
         "print(\"the same computation\")"),
)

# ----------------------------------------------------------------- masks
lesson(
    "06_masks",
    md("# 第 6 课：掩码（种子文章 000 第 8 节，种子文章 001 第 1 节）\n\n"
       "两篇种子文章的掩码含义相反：种子文章 000 里 1 = 屏蔽（`mask * -1e9`），"
       "种子文章 001 里 0 = 屏蔽（`masked_fill(mask == 0, -1e9)`）。attnlab 只用一种："
       "布尔值，True = 可以关注。`from_blocked` 和 `from_keep` 负责转换。",
       "# Lesson 6: masks (seed 000 section 8, seed 001 section 1)\n\n"
       "The two seeds' masks mean opposite things: in seed 000 1 = blocked (`mask * -1e9`), "
       "in seed 001 0 = blocked (`masked_fill(mask == 0, -1e9)`). attnlab has one: bool, "
       "True = may attend. `from_blocked` and `from_keep` convert."),
    code("seed000_mask = np.array([[0, 0, 1], [0, 0, 1], [0, 0, 1]])   # 1 = blocked\n"
         "seed001_mask = 1 - seed000_mask                               # 0 = blocked\n"
         "allowed = attnlab.from_blocked(seed000_mask)\n"
         "assert np.array_equal(allowed, attnlab.from_keep(seed001_mask))\n"
         "padded = attnlab.explain(tokens=[\"小明\", \"去了\", \"[PAD]\"], mask=allowed)\n"
         "print(padded.get(\"weights\").values)"),
    md("**练习**：用 `key_padding`（命令行 `--padding 1,1,0`）屏蔽填充词元，再试左填充加因果掩码。\n\n"
       "**预期结果**：填充词元那一列权重全为 0；左填充时第一行什么都不能关注，权重全为 0，提示里写明。",
       "**Exercise**: block the padding token with `key_padding` (on the command line "
       "`--padding 1,1,0`), then try left padding with a causal mask.\n\n**Expected "
       "result**: the padding column's weights are all 0; with left padding the first row "
       "may attend to nothing, its weights are all 0, and the notes say so."),
    code("keep = np.array([True, True, False])\n"
         "right = attnlab.explain(tokens=[\"小明\", \"去了\", \"[PAD]\"], key_padding=keep)\n"
         "assert (right.get(\"weights\").values[:, 2] == 0).all()\n"
         "left = attnlab.explain(tokens=[\"[PAD]\", \"小明\", \"去了\"], key_padding=keep[::-1].copy(),\n"
         "                       is_causal=True)\n"
         "assert (left.get(\"weights\").values[0] == 0).all()\n"
         "print([n[\"kind\"] for n in left.meta[\"notes\"]])"),
)

# ----------------------------------------------------------------- positions
lesson(
    "07_positional_encoding",
    md("# 第 7 课：位置编码（种子文章 001 第 3 节）\n\n"
       "自注意力本身不看顺序：同一个词元出现两次，两行输入完全相同，两行注意力权重也完全相同。",
       "# Lesson 7: positional encoding (seed 001 section 3)\n\n"
       "Self-attention itself ignores order: a token that appears twice has two identical "
       "input rows, and so two identical rows of weights."),
    code("tokens = \"the cat sat on the mat\".split()\n"
         "plain = attnlab.explain(tokens=tokens)\n"
         "print(report.note_lines(plain, LANG)[1])\n"
         "w = plain.get(\"weights\").values\n"
         "print(w[0], w[4])"),
    md("**练习**：加上正弦位置编码（`pos=\"sinusoidal\"`，命令行 `--pos sinusoidal`），"
       "再试 RoPE（`pos=\"rope\"`，d_k 要是偶数）。\n\n"
       "**预期结果**：两个 the 的权重行不再相同；RoPE 下同一个向量放在各个位置时，"
       "分数只取决于两个位置的距离（每条对角线上的值相同）。",
       "**Exercise**: add the sinusoidal encoding (`pos=\"sinusoidal\"`, on the command "
       "line `--pos sinusoidal`), then RoPE (`pos=\"rope\"`, with an even d_k).\n\n"
       "**Expected result**: the two rows of \"the\" now differ; under RoPE, one vector "
       "placed at every position gets scores that depend only on the distance (each "
       "diagonal is constant)."),
    code("placed = attnlab.explain(tokens=tokens, pos=\"sinusoidal\")\n"
         "w = placed.get(\"weights\").values\n"
         "assert not np.allclose(w[0], w[4])\n"
         "same = attnlab.explain(X=np.tile([[0.3, -1.2, 0.8, 0.5]], (5, 1)), pos=\"rope\", d_k=4)\n"
         "S = same.get(\"scores\").values\n"
         "assert np.allclose(np.diagonal(S, 1), np.diagonal(S, 1)[0])\n"
         "report.draw(\"positions\", lang=LANG)"),
)

# ----------------------------------------------------------------- the layer
lesson(
    "08_the_layer",
    md("# 第 8 课：完整的自注意力层（种子文章 001 第 4 节）\n\n"
       "多头输出拼接后乘以 Wo，加上残差，再做层归一化：`LayerNorm(x + attention(x))`（Post-LN，"
       "种子文章 001 的代码）。文中说现代实现多用 Pre-LN：`x + attention(LayerNorm(x))`。",
       "# Lesson 8: the whole self-attention layer (seed 001 section 4)\n\n"
       "The heads' concatenation times Wo, plus the residual, then LayerNorm: "
       "`LayerNorm(x + attention(x))` (post-LN, seed 001's code). Its text says modern "
       "code prefers pre-LN: `x + attention(LayerNorm(x))`."),
    code("post = attnlab.explain(num_heads=2, d_k=2, Wo=True, norm=\"post\")\n"
         "print([s.key for s in post][-4:])\n"
         "print(post.output)"),
    md("**练习**：检查 Post-LN 的输出每一行均值为 0、方差为 1；再换成 `norm=\"pre\"`。\n\n"
       "**预期结果**：Post-LN 每行均值≈0、方差≈1（LayerNorm 的 ε = 1e-5 让方差略小于 1）；"
       "Pre-LN 的输出是 x 加上注意力，不再归一化。",
       "**Exercise**: check that each row of the post-LN output has mean 0 and variance 1; "
       "then switch to `norm=\"pre\"`.\n\n**Expected result**: post-LN rows have mean ≈ 0 "
       "and variance ≈ 1 (LayerNorm's ε = 1e-5 makes it a little under 1); the pre-LN "
       "output is x plus attention, not normalised."),
    code("out = post.output\n"
         "assert np.allclose(out.mean(-1), 0, atol=1e-12) and np.allclose(out.var(-1), 1, atol=1e-4)\n"
         "pre = attnlab.explain(num_heads=2, d_k=2, Wo=True, norm=\"pre\")\n"
         "assert [s.key for s in pre][-1] == \"residual\"\n"
         "print(pre.output.var(-1))"),
)

# ----------------------------------------------------------------- efficiency
lesson(
    "09_efficiency",
    md("# 第 9 课：实战中的优化（种子文章 001 第 5 节）\n\n"
       "Flash Attention 按块读取键，只保留每行的运行最大值 m 和运行和 l，从不保存 (T, S) 矩阵；"
       "KV 缓存在解码时保存之前的 K、V；稀疏注意力只保留部分键；低秩近似把注意力矩阵换成低秩乘积。",
       "# Lesson 9: the tricks of practice (seed 001 section 5)\n\n"
       "Flash attention reads the keys tile by tile, keeping only each row's running max m "
       "and running sum l, never the (T, S) matrix; the KV cache keeps earlier K and V while "
       "decoding; sparse attention keeps some keys; low-rank approximations replace the "
       "attention matrix by a low-rank product."),
    code("report.draw(\"flash\", lang=LANG)"),
    md("**练习**：验证 Flash Attention 和 KV 缓存与普通注意力给出相同结果。\n\n"
       "**预期结果**：两者都与 `scaled_dot_product_attention` 一致（差别小于 1e-12）。",
       "**Exercise**: check that flash attention and the KV cache give what plain attention "
       "gives.\n\n**Expected result**: both equal `scaled_dot_product_attention` (within "
       "1e-12)."),
    code("rng = np.random.default_rng(0)\n"
         "q, k, v = (rng.standard_normal((1, 2, 16, 8)) for _ in range(3))\n"
         "exact = attnlab.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
         "assert np.allclose(attnlab.flash_attention(q, k, v, is_causal=True, block_k=4), exact, atol=1e-12)\n"
         "cache = attnlab.KVCache(1, 2, 8, max_len=16)\n"
         "steps = [cache.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(16)]\n"
         "assert np.allclose(np.concatenate(steps, axis=2), exact, atol=1e-12)\n"
         "report.draw(\"kvcache\", lang=LANG)"),
    md("稀疏与低秩：`report.draw(\"sparse\", lang=\"zh\")`，以及 README 中 "
       "“Sparse and low-rank attention, and what they lose” 一节的测量。",
       "Sparse and low-rank: `report.draw(\"sparse\")`, and the measurements in the "
       "README's section \"Sparse and low-rank attention, and what they lose\"."),
)

# ----------------------------------------------------------------- debugging checklist
lesson(
    "10_debugging_checklist",
    md("# 第 10 课：调试检查清单（种子文章 001 第 5 节）\n\n"
       "1. 注意力权重分布是否合理（不应全均匀或过度稀疏）\n2. 梯度范数是否稳定\n"
       "3. 各头注意力模式是否多样",
       "# Lesson 10: the debugging checklist (seed 001 section 5)\n\n"
       "1. Are the weights reasonable (neither all uniform nor over-sparse)?\n"
       "2. Are the gradient norms stable?\n3. Do the heads attend in diverse ways?"),
    code("from attnlab.lens.diagnostics import diagnose\n"
         "uniform = np.full((4, 4), 0.25)\n"
         "one_hot = np.eye(4)\n"
         "d = diagnose(np.stack([uniform, one_hot, one_hot]))\n"
         "print(report.diagnostics_table(d, LANG))"),
    md("**练习**：找出近似均匀的头和重复的头；再用 `attnlab.grad_diagnostics` 看一层的梯度范数。\n\n"
       "**预期结果**：第 1 个头近似均匀，第 2、3 个头过度稀疏且 JS 距离为 0（重复）；"
       "梯度范数都是有限值。",
       "**Exercise**: find the near-uniform head and the duplicated heads; then look at a "
       "layer's gradient norms with `attnlab.grad_diagnostics`.\n\n**Expected result**: "
       "head 1 is near uniform, heads 2 and 3 are over-sparse and at JS distance 0 "
       "(duplicates); every gradient norm is finite."),
    code("assert d.heads[0].near_uniform and d.heads[1].over_sparse\n"
         "assert d.layers[0].near_duplicates[0][:2] == (1, 2)\n"
         "mha = attnlab.MultiHeadAttention.init(2, 8, seed=0)\n"
         "x = np.random.default_rng(0).standard_normal((5, 8))\n"
         "grads = attnlab.grad_diagnostics.grad_norms(mha, x, dout=np.ones((5, 8)))\n"
         "assert not grads.nonfinite\n"
         "print({name: round(norm, 3) for name, norm in grads.norms.items()})"),
)

# ----------------------------------------------------------------- seed 002
lesson(
    "11_walkthrough",
    md("# 第 11 课：自注意力到底在算什么（种子文章 002）\n\n"
       "Attention(Q, K, V) = softmax(QKᵀ / √d_k) V：用 Q 去看 K 得到权重，再用权重对 V 加权求和。"
       "例句“小明 去了 学校”。",
       "# Lesson 11: what self-attention computes (seed 002)\n\n"
       "Attention(Q, K, V) = softmax(QKᵀ / √d_k) V: Q looks at K to get weights, the "
       "weights sum V. The example sentence 小明 / 去了 / 学校."),
    code("trace = attnlab.explain(tokens=[\"小明\", \"去了\", \"学校\"], d_k=4)\n"
         "w = trace.get(\"weights\").values\n"
         "for i, token in enumerate(trace.tokens):\n"
         "    print(token, \"→\", trace.tokens[w[i].argmax()], round(w[i].max(), 4))\n"
         "print(report.note_lines(trace, LANG)[0])"),
    md("**看什么**：提示第一条：权重是随机的，哪个词元关注哪个词元还没有意义。"
       "种子文章 002 的故事（“去了”更关注“学校”）要靠训练得到的权重；真实模型见 README 的 "
       "“A real model on attnlab's attention: `attnlab inspect`” 一节。\n\n"
       "**练习**：换 5 个 seed，看“去了”最关注哪个词元。\n\n"
       "**预期结果**：随 seed 而变：未训练的权重没有固定的模式。",
       "**What to look at**: the first note: the weights are random, so which token attends "
       "to which means nothing yet. Seed 002's story (去了 attending to 学校) needs trained "
       "weights; for a real model see the README's section \"A real model on attnlab's "
       "attention: `attnlab inspect`\".\n\n**Exercise**: over 5 seeds, see which token "
       "去了 attends to most.\n\n**Expected result**: it changes with the seed: untrained "
       "weights have no fixed pattern."),
    code("tops = [attnlab.explain(tokens=[\"小明\", \"去了\", \"学校\"], d_k=4, seed=s)\n"
         "        .get(\"weights\").values[1].argmax() for s in range(5)]\n"
         "print(tops)\n"
         "assert len(set(tops)) > 1"),
)


def notebook(stem: str, cells: list[tuple[str, object]], lang: str) -> dict:
    out = []
    for number, (kind, content) in enumerate(cells):
        cell_id = f"{stem}-{number}"
        if kind == "md":
            text = content[lang]  # type: ignore[index]
            out.append({"cell_type": "markdown", "id": cell_id, "metadata": {},
                        "source": _lines(text)})
        else:
            text = str(content).replace("{lang}", lang)
            out.append({"cell_type": "code", "execution_count": None, "id": cell_id,
                        "metadata": {}, "outputs": [], "source": _lines(text)})
    return {"cells": out, "nbformat": 4, "nbformat_minor": 5, "metadata": {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"}}}


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + [lines[-1]]


def main() -> None:
    for lang in ("zh", "en"):
        folder = ROOT / lang
        folder.mkdir(parents=True, exist_ok=True)
        for stem, cells in LESSONS:
            path = folder / f"{stem}.ipynb"
            path.write_text(json.dumps(notebook(stem, cells, lang), ensure_ascii=False, indent=1)
                            + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
