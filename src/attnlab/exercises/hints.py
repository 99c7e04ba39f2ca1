# ruff: noqa: E501  (a hint reads best on one line)
"""The checker's messages, keyed, in Chinese and English.

A message is a key plus parameters (``{case}``, ``{expected}``...), rendered in the
learner's language by :func:`render`. The Chinese uses d2l's terms (注意力汇聚,
掩蔽, 层规范化).
"""

from __future__ import annotations

from typing import Any

from ..errors import AttnlabError

__all__ = ["HINTS", "CASES", "render", "case_label", "LANGS"]

LANGS = ("zh", "en")

#: key -> (zh, en)
HINTS: dict[str, tuple[str, str]] = {
    # -- outcomes every exercise shares
    "ok": ("正确！通过了全部 {n} 组检查（随机输入和边界情况）。",
           "Correct: all {n} checks passed (random inputs and edge cases)."),
    "not_written": ("还没有写：把 `raise NotImplementedError` 换成你的代码，再运行这个检查。",
                    "Not written yet: replace `raise NotImplementedError` with your code, then run this check again."),
    "not_callable": ("check 需要你写的函数本身（例如 check(\"{name}\", {name})），收到的是 {kind}。",
                     "check needs your function itself (e.g. check(\"{name}\", {name})); it received {kind}."),
    "crashed": ("你的函数在「{case}」上出错：{error}",
                "Your function failed on \"{case}\": {error}"),
    "not_array": ("返回值应是 NumPy 数组，得到的是 {kind}（「{case}」）。",
                  "The return value should be a NumPy array; got {kind} (\"{case}\")."),
    "shape": ("形状不对（「{case}」）：期望 {expected}，得到 {got}。",
              "Wrong shape (\"{case}\"): expected {expected}, got {got}."),
    "nonfinite": ("输出里有 NaN 或 inf（「{case}」）：检查除法和 exp。",
                  "The output holds NaN or inf (\"{case}\"): look at the divisions and the exp."),
    "wrong": ("数值不对（「{case}」）：与 attnlab 的结果最大相差 {diff:.3g}。",
              "Wrong values (\"{case}\"): up to {diff:.3g} away from attnlab's result."),
    # -- Q, K, V
    "qkv_not_three": ("应返回三个数组 (Q, K, V)，得到的是 {kind}。",
                      "Return three arrays (Q, K, V); got {kind}."),
    "qkv_order": ("Q、K、V 的顺序不对：应返回 (X @ Wq, X @ Wk, X @ Wv)。",
                  "Q, K and V are in the wrong order: return (X @ Wq, X @ Wk, X @ Wv)."),
    "qkv_weight_first": ("矩阵乘法的顺序反了：X 的每一行是一个词元，应写 X @ Wq，而不是 Wq @ X。",
                         "The product is the wrong way round: each row of X is a token, so write X @ Wq, not Wq @ X."),
    "qkv_transposed_weight": ("权重已经是 (E, D) 形状：直接写 X @ Wq，不要转置 Wq。",
                              "The weights are already (E, D): write X @ Wq, without transposing Wq."),
    # -- scores and scaling
    "no_transpose": ("把 K 转置了吗？分数是 Q @ K.T，形状 (T, S)。",
                     "Did you transpose K? The scores are Q @ K.T, of shape (T, S)."),
    "scores_transposed": ("行和列反了：第 i 行是第 i 个查询对每个键的分数，应写 Q @ K.T，不是 K @ Q.T。",
                          "Rows and columns are swapped: row i holds query i's score for every key; write Q @ K.T, not K @ Q.T."),
    "scaled_too_early": ("这一步只求点积 Q @ K.T；除以 √d_k 是下一步的事。",
                         "This step is the dot product Q @ K.T only; dividing by √d_k is the next step."),
    "no_scale": ("没有除以 √d_k：分数要除以 np.sqrt(d_k)，d_k 是 K 的最后一维。",
                 "You did not divide by √d_k: divide the scores by np.sqrt(d_k), d_k being K's last dimension."),
    "scale_by_dk": ("除以的是 d_k，应除以 √d_k（np.sqrt(d_k)）。",
                    "You divided by d_k; divide by √d_k (np.sqrt(d_k))."),
    "scale_by_length": ("√d_k 里的 d_k 是每个键向量的维度（K.shape[-1]），不是词元个数。",
                        "The d_k in √d_k is the width of each key vector (K.shape[-1]), not the number of tokens."),
    "scale_multiplied": ("乘以了 √d_k，应除以 √d_k。", "You multiplied by √d_k; divide by it."),
    # -- softmax
    "softmax_axis": ("每行权重之和不是 1：softmax 的 axis 对吗？应沿最后一维（axis=-1，每一行）归一化。",
                     "The rows of weights do not sum to 1: is softmax's axis right? Normalise along the last axis (axis=-1, each row)."),
    "softmax_global_sum": ("除以的是整个矩阵的和：每一行要单独归一化，np.sum(..., axis=-1, keepdims=True)。",
                           "You divided by the sum of the whole matrix: normalise each row on its own, np.sum(..., axis=-1, keepdims=True)."),
    "softmax_no_keepdims": ("求和时少了 keepdims=True：(T,) 的行和会按列广播，而不是按行。",
                            "The sum lacks keepdims=True: a (T,) vector of row sums broadcasts across columns, not rows."),
    "softmax_no_max": ("没有减去每行的最大值：大的 logits（例如 1000）让 np.exp 溢出成 inf，结果是 NaN。先 x - x.max(axis=-1, keepdims=True)。",
                       "You did not subtract each row's maximum: large logits (e.g. 1000) overflow np.exp to inf and give NaN. Compute x - x.max(axis=-1, keepdims=True) first."),
    "softmax_global_max": ("减去的是整个矩阵的最大值：数值差得远的行会下溢成 0/0。应减去每一行自己的最大值（axis=-1, keepdims=True）。",
                           "You subtracted the maximum of the whole matrix: a row far below it underflows to 0/0. Subtract each row's own maximum (axis=-1, keepdims=True)."),
    # -- the weighted sum (attention pooling)
    "returned_weights": ("返回的是注意力权重 (T, S)：还要用权重对 V 加权求和，weights @ V。",
                         "You returned the attention weights (T, S): the output is their weighted sum of V, weights @ V."),
    "weights_transposed": ("权重转置了：输出是 weights @ V，第 i 行用第 i 个查询的权重。",
                           "The weights are transposed: the output is weights @ V, row i using query i's weights."),
    "output_transposed": ("输出转置了：应是 (T, Dv)，每行对应一个查询。",
                          "The output is transposed: it should be (T, Dv), one row per query."),
    # -- masks
    "mask_reversed": ("掩码方向反了：True 表示可以关注（attnlab 的约定），False 才是被掩蔽。",
                      "The mask is the wrong way round: True means may attend (attnlab's rule), False is masked out."),
    "mask_seed000": ("这是原文 000 的约定（1 = 屏蔽）；attnlab 用布尔值，True = 可以关注：返回 np.tril(np.ones((T, T), dtype=bool))。",
                     "This is seed 000's convention (1 = blocked); attnlab uses booleans, True = may attend: return np.tril(np.ones((T, T), dtype=bool))."),
    "mask_not_bool": ("值对了，但应返回布尔数组（dtype=bool），True = 可以关注。",
                      "The values are right, but return a boolean array (dtype=bool), True = may attend."),
    "causal_no_diagonal": ("对角线也要是 True：每个词元可以关注它自己（np.tril，k=0）。",
                           "The diagonal must be True too: each token may attend to itself (np.tril with k=0)."),
    "padding_off_by_one": ("差了一个：位置 j < valid_len 才是真实词元（用 <，不是 <=）。",
                           "Off by one: position j is a real token when j < valid_len (use <, not <=)."),
    "mask_after_softmax": ("在 softmax 之后才掩蔽：每行之和不再是 1。应在 softmax 之前把被掩蔽的分数设为 -inf（np.where(mask, scores, -np.inf)）。",
                           "You masked after the softmax: the rows no longer sum to 1. Set the masked scores to -inf before the softmax (np.where(mask, scores, -np.inf))."),
    "full_row_minus_1e9": ("某一行全部被掩蔽时，原文 000 的 -1e9 写法在减去每行最大值之后被抵消：这一行等于没有掩蔽（加上 -1e9 时）或成了所有 V 的平均（换成 -1e9 时），悄无声息。attnlab 约定这一行输出 0：例如最后 np.where(mask.any(-1, keepdims=True), out, 0)。",
                           "When a whole row is masked, seed 000's -1e9 cancels once the row maximum is subtracted: silently, the row is as if unmasked (-1e9 added) or the average of all of V (scores replaced by -1e9). attnlab's rule is an output of 0 there: e.g. end with np.where(mask.any(-1, keepdims=True), out, 0)."),
    "full_row_nan": ("某一行全部被掩蔽时，这一行的 softmax 成了 0/0（或 -inf - (-inf)），得到 NaN。attnlab 约定这一行输出 0：例如最后 np.where(mask.any(-1, keepdims=True), out, 0)。",
                     "When a whole row is masked, its softmax becomes 0/0 (or -inf - (-inf)) and gives NaN. attnlab's rule is an output of 0 there: e.g. end with np.where(mask.any(-1, keepdims=True), out, 0)."),
    # -- heads
    "split_no_transpose": ("还差一步：reshape 成 (B, T, H, D) 之后，交换 T 和 H 两维，得到 (B, H, T, D)。",
                           "One step missing: after the reshape to (B, T, H, D), swap the T and H axes to get (B, H, T, D)."),
    "split_reshape_only": ("直接 reshape 成 (B, H, T, D) 会把不同词元的特征混进同一个头：先 reshape 成 (B, T, H, D)，再 transpose(0, 2, 1, 3)。",
                           "Reshaping straight to (B, H, T, D) mixes different tokens' features into one head: reshape to (B, T, H, D) first, then transpose(0, 2, 1, 3)."),
    "split_interleaved": ("每个头取的是相邻的 D 列：reshape 成 (B, T, H, D)，不是 (B, T, D, H)。",
                          "Each head takes D adjacent columns: reshape to (B, T, H, D), not (B, T, D, H)."),
    "merge_reshape_only": ("直接 reshape 会把不同词元混在一起：先 transpose(0, 2, 1, 3) 回到 (B, T, H, D)，再 reshape 成 (B, T, H*D)。",
                           "Reshaping directly mixes tokens: transpose(0, 2, 1, 3) back to (B, T, H, D) first, then reshape to (B, T, H*D)."),
    "mha_scale_width": ("缩放用的是 √E：每个头的 d_k = E / H，应除以 √(E / H)。",
                        "You scaled by √E: each head's d_k is E / H, divide by √(E / H)."),
    "mha_no_wo": ("忘了输出投影：多个头拼接之后还要乘以 Wo。",
                  "The output projection is missing: multiply the concatenated heads by Wo."),
    "mha_no_split": ("没有拆成多个头：这是一个 E 维的单头注意力。先把 Q、K、V 拆成 H 个 (T, E/H) 的头，各自做注意力，再拼接。",
                     "The heads are not split: this is one attention of width E. Split Q, K and V into H heads of (T, E/H), attend in each, then concatenate."),
    "mha_bad_split": ("拆头的 reshape 有误：第 h 个头是 Q 的第 h*D 到 (h+1)*D 列（reshape 成 (T, H, D) 再转置）。",
                      "The head split is wrong: head h is columns h*D to (h+1)*D of Q (reshape to (T, H, D), then transpose)."),
    # -- positions
    "pe_swapped": ("sin 和 cos 放反了：偶数列（0, 2, ...）是 sin，奇数列是 cos；第 0 行应是 [0, 1, 0, 1, ...]。",
                   "sin and cos are swapped: even columns (0, 2, ...) are sin, odd ones cos; row 0 should be [0, 1, 0, 1, ...]."),
    "pe_halves": ("前一半 sin、后一半 cos 是另一种排法；原文 001 是交错的：pe[:, 0::2] = sin，pe[:, 1::2] = cos。",
                  "sin in the first half and cos in the second is another layout; seed 001 interleaves them: pe[:, 0::2] = sin, pe[:, 1::2] = cos."),
    "pe_column_exponent": ("奇数列要和它前面的偶数列同一个频率：指数是 2i / d_model，i 是第几对（列号整除 2），不是列号本身。",
                           "An odd column shares the frequency of the even column before it: the exponent is 2i / d_model with i the pair index (column // 2), not the column."),
    "pe_pair_exponent": ("频率的指数应是 2i / d_model（i 是第几对），你用的是 i / d_model。",
                         "The frequency's exponent is 2i / d_model (i the pair index); you used i / d_model."),
    "pe_from_one": ("位置从 0 开始：第 0 行应是 [0, 1, 0, 1, ...]（sin 0 = 0，cos 0 = 1）。",
                    "Positions start at 0: row 0 should be [0, 1, 0, 1, ...] (sin 0 = 0, cos 0 = 1)."),
    # -- layer normalisation and the layer
    "ln_unbiased": ("层规范化用有偏方差（除以 E，np.var 的默认 ddof=0），不是无偏的 n - 1。",
                    "Layer normalisation uses the biased variance (divide by E, np.var's default ddof=0), not n - 1."),
    "ln_axis": ("层规范化是在每个词元的特征上做的：沿最后一维（axis=-1, keepdims=True），不是沿词元。",
                "Layer normalisation works over each token's features: along the last axis (axis=-1, keepdims=True), not across tokens."),
    "ln_eps_outside": ("ε 要加在方差上：(x - mean) / np.sqrt(var + eps)，不是 / (std + eps)。",
                       "ε goes inside the square root: (x - mean) / np.sqrt(var + eps), not / (std + eps)."),
    "ln_no_eps": ("所有特征都相同的行方差为 0：没有 ε 就会除以 0。写 np.sqrt(var + eps)，eps = 1e-5。",
                  "A row whose features are all equal has variance 0: without ε it divides by 0. Write np.sqrt(var + eps), eps = 1e-5."),
    "block_no_residual": ("忘了残差连接：要把输入 x 加回来（x + attention(...)）。",
                          "The residual connection is missing: add the input x back (x + attention(...))."),
    "block_swapped": ("Post-LN 和 Pre-LN 放反了：post 是 layer_norm(x + attention(x))，pre 是 x + attention(layer_norm(x))。",
                      "Post-LN and pre-LN are swapped: post is layer_norm(x + attention(x)), pre is x + attention(layer_norm(x))."),
    "block_pre_extra_norm": ("Pre-LN 的输出不再做层规范化：x + attention(layer_norm(x)) 就是结果。",
                             "Pre-LN does not normalise its output: x + attention(layer_norm(x)) is the result."),
    # -- flash's online softmax
    "online_no_correction": ("换了新的最大值以后，之前累加的 l 和 acc 没有重新缩放：先乘以 np.exp(m_old - m_new)，再加上这一块。",
                             "After a new maximum, the l and acc summed so far were not rescaled: multiply them by np.exp(m_old - m_new), then add this tile."),
    "online_no_divide": ("最后还要除以 l：输出是 acc / l。", "One last step: the output is acc / l."),
    "online_last_tile": ("最后一块不满 block 个键时也要算：用 range(0, S, block)，切片 K[start:start + block]。",
                         "The last tile counts even with fewer than block keys: use range(0, S, block) and slices K[start:start + block]."),
    # -- softmax's gradient
    "sb_no_subtract": ("还差一项：dx = y ⊙ (dy − Σ_j dy_j y_j)，每行减去 np.sum(dy * y, axis=-1, keepdims=True)。",
                       "A term is missing: dx = y ⊙ (dy − Σ_j dy_j y_j), subtract np.sum(dy * y, axis=-1, keepdims=True) in each row."),
    "sb_diagonal": ("只用了雅可比矩阵的对角线 y(1 − y)：softmax 的每个输出依赖整行输入，还有 −y_i y_j 的非对角项。",
                    "You used only the Jacobian's diagonal y(1 − y): each softmax output depends on the whole row, the off-diagonal terms −y_i y_j count too."),
    "sb_axis": ("求和的方向不对：Σ_j dy_j y_j 是沿每一行（axis=-1, keepdims=True）求和。",
                "The sum runs the wrong way: Σ_j dy_j y_j is over each row (axis=-1, keepdims=True)."),
}

#: the inputs the checker tries, named for the learner: key -> (zh, en)
CASES: dict[str, tuple[str, str]] = {
    "seed": ("原文 000 的 X", "seed 000's X"),
    "random": ("随机输入", "random inputs"),
    "square": ("方阵输入（T = S = D）", "square inputs (T = S = D)"),
    "rect": ("T ≠ S ≠ D 的随机输入", "random inputs with T ≠ S ≠ D"),
    "one_token": ("只有 1 个词元", "a single token"),
    "wide": ("d_k = 16 的随机输入", "random inputs with d_k = 16"),
    "large": ("很大的 logits（约 1000）", "large logits (about 1000)"),
    "neg_inf": ("含 -inf（已被掩蔽）的分数", "scores holding -inf (masked)"),
    "far_rows": ("数值相差很远的两行", "two rows far apart in value"),
    "partial": ("部分被掩蔽的随机掩码", "a random mask, partly blocked"),
    "causal": ("因果掩码", "a causal mask"),
    "full_row": ("有一整行全被掩蔽", "a row with everything masked"),
    "zero_length": ("有效长度为 0 的序列", "a sequence of valid length 0"),
    "one_head": ("只有 1 个头", "a single head"),
    "three_heads": ("3 个头", "three heads"),
    "small_var": ("方差很小的输入", "inputs of tiny variance"),
    "constant_row": ("所有特征相同的一行", "a row whose features are all equal"),
    "ragged": ("最后一块不满的键", "a last tile with fewer keys"),
    "one_block": ("block = 1", "block = 1"),
    "post": ("norm=\"post\"", "norm=\"post\""),
    "pre": ("norm=\"pre\"", "norm=\"pre\""),
}


def _pick(pair: tuple[str, str], lang: str) -> str:
    if lang not in LANGS:
        raise AttnlabError(f"lang: expected 'zh' or 'en', got {lang!r}")
    return pair[LANGS.index(lang)]


def case_label(key: str, lang: str) -> str:
    """The name of the input case ``key`` in ``lang``."""
    return _pick(CASES[key], lang)


def render(key: str, lang: str, **params: Any) -> str:
    """The message ``key`` in ``lang``, with its parameters filled in."""
    return _pick(HINTS[key], lang).format(**params)
