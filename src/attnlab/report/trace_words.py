"""The words of a trace, in English and Chinese: each step's title and note, the notes
on what a trace shows, and the trace table's labels (:mod:`attnlab.report.text`,
the viewer). Re-exported by :mod:`attnlab.report.words`.
"""

from __future__ import annotations

__all__ = ["NOTE_TEXT", "STEP_TEXT", "TRACE_WORDS"]

#: Title and one-line explanation of each step kind, in English and Chinese.
#: Every note must be true of any trace: ``explain``'s (random weights, one layer)
#: and a trained model's (learned weights, several layers).
STEP_TEXT: dict[str, dict[str, tuple[str, str]]] = {
    "X": {
        "en": ("Input X", "one row per token: its vector (an embedding, or the previous "
               "layer's output)"),
        "zh": ("输入 X", "每一行是一个词元（token）的向量：词嵌入，或上一层的输出"),
    },
    "Wq": {
        "en": ("Query weights Wq", "projects each token's vector into query space "
               "(a real model learns it in training)"),
        "zh": ("查询权重 Wq", "把每个词元的向量投影到查询（Query）空间（真实模型中由训练学得）"),
    },
    "Wk": {
        "en": ("Key weights Wk", "projects each token's vector into key space "
               "(a real model learns it in training)"),
        "zh": ("键权重 Wk", "把每个词元的向量投影到键（Key）空间（真实模型中由训练学得）"),
    },
    "Wv": {
        "en": ("Value weights Wv", "projects each token's vector into value space "
               "(a real model learns it in training)"),
        "zh": ("值权重 Wv", "把每个词元的向量投影到值（Value）空间（真实模型中由训练学得）"),
    },
    "Q": {
        "en": ("Queries Q", "what each token is looking for (like a search query)"),
        "zh": ("查询 Q", "每个词元想“找”什么，相当于搜索请求"),
    },
    "K": {
        "en": ("Keys K", "what each token can be found by (like a document's index terms)"),
        "zh": ("键 K", "每个词元供查询来匹配的“索引关键词”"),
    },
    "V": {
        "en": ("Values V", "the content each token passes on when it is attended to"),
        "zh": ("值 V", "每个词元被关注时真正传递出去的内容"),
    },
    "scores": {
        "en": ("Scores Q·Kᵀ", "row i, column j: dot product of token i's query and "
               "token j's key, i.e. how well they match"),
        "zh": ("注意力分数 Q·Kᵀ", "第 i 行第 j 列：第 i 个词元的查询与第 j 个词元的键的点积，"
               "即二者的匹配程度"),
    },
    "scaled": {
        "en": ("Scaled scores", "q·k sums d_k products, so its variance grows like d_k; "
               "÷√d_k cancels that, so softmax does not saturate (saturated, it passes "
               "almost no gradient)"),
        "zh": ("缩放后的分数", "q·k 是 d_k 个乘积之和，方差随 d_k 增大；除以 √d_k 抵消这一增长，"
               "softmax 才不会饱和（饱和时几乎传不回梯度）"),
    },
    "masked": {
        "en": ("Masked scores", "blocked positions (e.g. later tokens, under a causal mask) "
               "set to -∞, so softmax gives them weight 0"),
        "zh": ("掩码后的分数", "被屏蔽的位置（如因果掩码下排在后面的词元）设为 -∞，"
               "softmax 后权重为 0"),
    },
    "weights": {
        "en": ("Attention weights", "softmax of each row: every weight ≥ 0, each row sums "
               "to 1; row i is how token i divides its attention"),
        "zh": ("注意力权重", "对每一行做 softmax：权重都 ≥ 0，每行之和为 1；"
               "第 i 行就是第 i 个词元的注意力分配"),
    },
    "output": {
        "en": ("Output", "row i = the rows of V summed with row i's weights "
               "(a weighted average)"),
        "zh": ("输出", "第 i 行 = 用第 i 行注意力权重对 V 的各行加权求和（即加权平均）"),
    },
    "concat": {
        "en": ("Concatenated heads", "the heads' outputs side by side, column-wise"),
        "zh": ("拼接多头输出", "把各个头的输出按列拼接在一起"),
    },
    "Wo": {
        "en": ("Output weights Wo", "mixes the concatenated heads into one output"),
        "zh": ("输出权重 Wo", "把拼接后的多头输出融合为一个输出"),
    },
    "projected": {
        "en": ("Projected output", "concat · Wo: the output of multi-head attention"),
        "zh": ("投影后的输出", "拼接结果乘以 Wo，即多头注意力的最终输出"),
    },
}


STEP_TEXT.update({
    "pe": {
        "en": ("Positional encoding pe", "one row per position: attention itself ignores "
               "order, so the position is added to each token's vector"),
        "zh": ("位置编码 pe", "每个位置一行：注意力本身不看顺序，"
               "所以把位置信息加到每个词元的向量上"),
    },
    "embedded": {
        "en": ("Input with positions x = X + pe", "the same token at two positions now has "
               "two different vectors"),
        "zh": ("加上位置后的输入 x = X + pe", "同一个词元在不同位置上，现在有了不同的向量"),
    },
    "normed_in": {
        "en": ("LayerNorm of the input (pre-LN)", "each row centred and scaled to unit "
               "variance before attention"),
        "zh": ("输入的层规范化（Pre-LN）", "在注意力之前，把每一行减去均值、除以标准差"),
    },
    "Q_all": {
        "en": ("All queries X·Wq", "one projection for every head: (T, H·d_k), split next"),
        "zh": ("全部查询 X·Wq", "所有头共用一次投影：(T, H·d_k)，接下来再拆分成多个头"),
    },
    "K_all": {
        "en": ("All keys X·Wk", "one projection for every head: (T, H·d_k), split next"),
        "zh": ("全部键 X·Wk", "所有头共用一次投影：(T, H·d_k)，接下来再拆分成多个头"),
    },
    "V_all": {
        "en": ("All values X·Wv", "one projection for every head: (T, H·d_v), split next"),
        "zh": ("全部值 X·Wv", "所有头共用一次投影：(T, H·d_v)，接下来再拆分成多个头"),
    },
    "Q_rope": {
        "en": ("Queries after RoPE", "each pair of features turned by an angle that grows "
               "with the position"),
        "zh": ("旋转位置编码后的查询", "每一对特征按随位置增大的角度旋转"),
    },
    "K_rope": {
        "en": ("Keys after RoPE", "turned like the queries: q·k now depends on how far "
               "apart the two tokens are"),
        "zh": ("旋转位置编码后的键", "与查询同样旋转：q·k 于是取决于两个词元相隔多远"),
    },
    "residual": {
        "en": ("Residual connection", "the layer's input added back, so a deep stack "
               "can pass information (and gradients) straight through"),
        "zh": ("残差连接", "把这一层的输入加回来，"
               "深层网络才能让信息和梯度直接通过"),
    },
    "normed": {
        "en": ("LayerNorm (post-LN)", "each row centred and scaled to unit variance: the "
               "layer's output"),
        "zh": ("层规范化（Post-LN）", "把每一行减去均值、除以标准差：这一层的输出"),
    },
})

#: The sentences of ``explain``'s notes (``trace.meta["notes"]``, made by
#: :mod:`attnlab.lens.explain_notes`), filled with the note's fields.
NOTE_TEXT: dict[str, dict[str, str]] = {
    "untrained": {
        "en": "The weights are random, not trained: which token attends to which means "
              "nothing yet. A story like seed 002's (去了 → 学校) is what trained weights "
              "learn; see a real model with `attnlab inspect`.",
        "zh": "这些权重是随机的，没有经过训练：哪个词元关注哪个词元，现在还没有任何含义。"
              "像原文 002 那样的故事（去了 → 学校）是训练后的权重才学得到的；"
              "真实模型请看 `attnlab inspect`。",
    },
    "untrained_causal": {
        "en": "The weights are random, not trained: which token attends to which means "
              "nothing yet. Under the causal mask each token sees only itself and the tokens "
              "before it: a later word (学校 after 去了) is out of its reach whatever the "
              "training, so seed 002's story (去了 → 学校) needs attention without the mask.",
        "zh": "这些权重是随机的，没有经过训练：哪个词元关注哪个词元，现在还没有任何含义。"
              "因果掩蔽下每个词元只能看到它自己和它前面的词元：后面的词（“去了”之后的“学校”）"
              "无论怎样训练都看不到，所以原文 002 的故事（去了 → 学校）要在不加掩码时才成立。",
    },
    "same_rows": {
        "en": "Tokens {tokens} (positions {positions}) have identical input rows, so they get "
              "identical rows of weights: attention alone cannot tell positions apart. "
              "Add positions (--pos sinusoidal) and look again.",
        "zh": "词元 {tokens}（位置 {positions}）的输入行完全相同，"
              "所以它们的注意力权重行也完全相同："
              "单靠注意力分不清位置。加上位置编码（--pos sinusoidal）再看一次。",
    },
    "scaling_off": {
        "en": "Scaling is off: softmax gets the raw scores Q·Kᵀ. Their spread grows like √d_k, "
              "so with a large d_k the weights turn one-hot.",
        "zh": "缩放已关闭：softmax 直接作用于原始注意力分数 Q·Kᵀ。分数的离散程度随 √d_k 增大，"
              "d_k 较大时权重会变成只关注一个词元。",
    },
    "saturated": {
        "en": "{where}the softmax is saturated in row(s) {rows}: one weight above 0.99, the scores "
              "spread over {spread}. Its gradient is nearly 0 there. Beyond a score of 709.78, "
              "exp overflows float64: seed 000's softmax (no max subtracted) then gives NaN.",
        "zh": "{where}第 {rows} 行的 softmax 已饱和：有一个权重大于 0.99，分数的跨度达 {spread}。"
              "这里的梯度几乎为 0。分数超过 709.78 时 exp 在 float64 中溢出："
              "原文 000 的 softmax"
              "（没有减去每行最大值）就会得到 NaN。",
    },
    "naive_overflow": {
        "en": "{where}seed 000's softmax, exp(s) / sum(exp(s)) without subtracting the row max, "
              "gives NaN or inf on these scores (largest |score| {max_score}); attnlab "
              "subtracts each row's max first, which changes nothing in exact arithmetic.",
        "zh": "{where}原文 000 的 softmax（exp(s) / sum(exp(s))，没有减去每行最大值）"
              "在这些分数上"
              "得到 NaN 或 inf（最大 |分数| 为 {max_score}）；attnlab 先减去每行的最大值，"
              "在精确运算下结果不变。",
    },
    "near_uniform": {
        "en": "{where}the weights are nearly uniform (every row's normalised entropy ≥ "
              "{entropy}): the scores barely differ. Seed 000's checklist: check the softmax "
              "and whether the inputs differ too little.",
        "zh": "{where}注意力权重几乎均匀（每一行的归一化熵 ≥ {entropy}）：注意力分数相差无几。"
              "原文 000 的排查清单：检查 softmax 是否正确、输入值是否差异过小。",
    },
    "constant_rows": {
        "en": "Rows {rows} ({tokens}) have all features equal, so LayerNorm maps them to 0 "
              "(x − mean = 0 in every feature, whatever ε): their queries, keys and values "
              "are 0, they attend uniformly and pass nothing on; the residual carries them "
              "through unchanged.",
        "zh": "第 {rows} 行（{tokens}）的所有特征都相同，所以层规范化把它们变成 0"
              "（每个特征都是 x − 均值 = 0，与 ε 无关）：它们的查询、键、值都是 0，"
              "注意力权重是均匀的，也不传出任何内容；残差连接把它们原样带过去。",
    },
    "fully_masked": {
        "en": "Rows {rows} ({tokens}) have no key to attend to (every key masked): attnlab gives "
              "them weights 0 and output 0. Elsewhere they go wrong silently: filled with -1e9 "
              "(seed 001) they get uniform weights; seed 000's additive mask (scores + "
              "mask * -1e9) with a max-subtracted softmax ignores the mask on them "
              "altogether (every score lost the same 1e9, which the max subtraction takes "
              "back); seed 000's own softmax gives NaN.",
        "zh": "第 {rows} 行（{tokens}）没有任何可以关注的键（全部被掩码）："
              "attnlab 给它们的权重和输出都是 0。"
              "别的写法会悄悄出错：用 -1e9 填充（原文 001）得到均匀的权重；"
              "原文 000 的加性掩码（scores + mask * -1e9）配上减去最大值的 softmax，"
              "在这些行上等于完全没有掩码（每个分数都减了同一个 1e9，减去最大值时又加了回来）；"
              "原文 000 自己的 softmax 得到 NaN。",
    },
}

TRACE_WORDS = {
    "en": {"head": "head", "layer": "layer", "shape": "shape", "colon": ": ",
           "row_sums": "row sums", "tokens": "Tokens", "trace": "Attention trace",
           "summary": "Summary", "summary_note": "Each token → the token it attends to "
           "most (the largest weight in its row)", "notes": "Notes"},
    "zh": {"head": "头", "layer": "层", "shape": "形状", "colon": "：",
           "row_sums": "每行之和", "tokens": "词元", "trace": "注意力计算过程",
           "summary": "小结", "summary_note": "每个词元 → 它最关注的词元（该行中最大的注意力权重）",
           "notes": "提示"},
}
