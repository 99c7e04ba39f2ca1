"""Every word attnlab shows, in English and Chinese: step titles and notes, table
headings, diagnostic flags, the viewer's interface.

Data modules (the trace, the diagnostics) hold numbers and keys only; the words for
them live here, with the report layer that renders them.
"""

from __future__ import annotations

from typing import Any, Literal

from ..lens.diagnostics import (
    NEAR_DUPLICATE_JS,
    NEAR_UNIFORM_ENTROPY,
    OVER_SPARSE_ENTROPY,
    OVER_SPARSE_MAX_WEIGHT,
    POSITIONAL_HEAD_SCORE,
    SINK_SHARE,
)

__all__ = ["CONCEPT_WORDS", "Lang", "LANGS", "NOTE_TEXT", "STEP_TEXT", "TRACE_WORDS",
           "COLUMN_NOTES", "FLAG_TEXT", "HEAD_COLUMNS", "LAYER_COLUMNS", "LIST_SEP", "VIEWER_WORDS"]

Lang = Literal["en", "zh"]
LANGS = ("en", "zh")

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

#: The name of each diagnostic flag (keys of ``HeadDiagnostics.flags``).
FLAG_TEXT = {
    "near_uniform": {"en": "near uniform", "zh": "近似均匀"},
    "over_sparse": {"en": "over-sparse", "zh": "过度稀疏"},
    "over_sparse_positional": {"en": "one-hot by position (expected, not over-sparse)",
                               "zh": "按位置的 one-hot（正常，不算过度稀疏）"},
    "sink": {"en": "sink", "zh": "停靠在特殊词元（sink）"},
    "previous_token": {"en": "previous-token", "zh": "关注前一个词元"},
    "next_token": {"en": "next-token", "zh": "关注后一个词元"},
    "self": {"en": "self", "zh": "关注自身"},
}
#: Column headings of the diagnostics tables: one row per head, one per layer.
HEAD_COLUMNS = {
    "en": ["layer", "head", "entropy", "max w", "[CLS]/[SEP]", "prev", "next", "self",
           "flags"],
    "zh": ["层", "头", "归一化熵", "平均最大权重", "[CLS]/[SEP] 占比", "前一个词元", "后一个词元",
           "自身", "提示"],
}
LAYER_COLUMNS = {
    "en": ["layer", "mean JS distance", "closest heads", "near-duplicate heads"],
    "zh": ["层", "平均 JS 距离", "最相近的两个头", "近似重复的头"],
}
LIST_SEP = {"en": ", ", "zh": "、"}  # between flags, between head pairs
#: What each column of the diagnostics tables means (printed under them).
COLUMN_NOTES = {
    "en": [
        "entropy: mean over rows of entropy / log(keys it may attend to); 1 = uniform, "
        "0 = all weight on one key",
        "max w: mean over rows of the largest weight",
        "[CLS]/[SEP]: mean weight on the [CLS] and [SEP] tokens",
        "prev / next / self: mean weight of query i on key i-1 / i+1 / i",
        "JS distance: the Jensen–Shannon distance between two heads' weight rows "
        "(square root of the JS divergence, base 2), averaged over rows: 0 = the heads "
        "attend identically, 1 = to disjoint keys",
    ],
    "zh": [
        "归一化熵：各行的熵 / log(该行可关注的键数) 的平均；1 = 完全均匀，0 = 全部权重落在一个键上",
        "平均最大权重：各行最大权重的平均",
        "[CLS]/[SEP] 占比：落在 [CLS] 和 [SEP] 词元上的平均权重",
        "前一个词元 / 后一个词元 / 自身：查询 i 对键 i-1 / i+1 / i 的平均权重",
        "JS 距离：两个头的注意力权重行之间的 Jensen–Shannon 距离（JS 散度的平方根，以 2 为底），"
        "对各行取平均：0 = 两个头的关注方式完全相同，1 = 关注的键完全不重叠",
    ],
}

#: The viewer page's interface text (embedded in the page as JSON).
VIEWER_WORDS: dict[str, dict[str, Any]] = {
    "en": {
        "title": "Attention viewer",
        "layer": "Layer",
        "head": "Head",
        "layer_option": "Layer {n}",
        "head_option": "Head {n}",
        "head_view": "Head view",
        "head_view_hint": "Hover a token: its lines show where it attends (opacity = weight).",
        "queries": "Query",
        "keys": "Key",
        "heatmap": "Attention weights",
        "heatmap_hint": "Row = query, column = key; each row sums to 1. Hover a cell for "
                        "its value; click query tokens to keep several rows in view.",
        "diagnostics": "Diagnostics",
        "overview": "All heads",
        "overview_hint": "Click a head to show it; untick layers or heads to hide them.",
        "rollout": "Attention rollout",
        "rollout_hint": "How much each output position draws on each input token through "
                        "all layers (Abnar & Zuidema 2020: heads averaged, half residual).",
        "importance": "Head importance",
        "importance_hint": "How much the output changes when a head is switched off "
                           "(larger = the model leans on it more). Click a cell to show it.",
        "loading": "loading…",
        "needs_js": "This page needs JavaScript to draw the attention view.",
        "precision_8bit": "(weights stored in 8 bits: within 0.002 of the exact value)",
        "decode_error": "This browser cannot unpack the weights (it needs DecompressionStream: "
                        "Chrome 80+, Firefox 113+, Safari 16.4+)",
        "js_explained": "JS distance (Jensen–Shannon, base 2): how differently two heads "
                        "spread their weight over the keys, averaged over the query rows; "
                        "0 = identical, 1 = no key in common.",
        "this_head": "This head",
        "this_layer": "This layer",
        "flags": "Flags",
        "no_flags": "none",
        "mean_js": "Mean JS distance between heads",
        "closest": "Closest pair",
        "duplicates": "Near-duplicate pairs",
        "to_others": "JS distance from this head to",
        "none": "–",
        "metrics": {
            "entropy": ("Normalised entropy", "mean over rows of entropy / log(number of "
                        "attendable keys): 1 = uniform, 0 = one-hot"),
            "max_weight": ("Mean max weight", "mean over rows of the largest weight"),
            "special_share": ("[CLS]/[SEP] share", "mean weight on [CLS]/[SEP] keys"),
            "previous_token": ("Previous token", "mean weight of query i on key i-1"),
            "next_token": ("Next token", "mean weight of query i on key i+1"),
            "self_token": ("Self", "mean weight of query i on key i"),
        },
        "neuron_view": "Neuron view",
        "neuron_hint": "One query and one key of this head: q, k and their product in each "
                       "dimension. The sum × scale is the score (logit) that softmax turns "
                       "into the weight. Click a heatmap cell to choose the pair.",
        "neuron_query": "query", "neuron_key": "key",
        "neuron_dims": "dimension", "neuron_q": "q", "neuron_k": "k", "neuron_qk": "q·k",
        "neuron_sum": "q·k = {dot}; × scale {scale} = logit {logit}; softmax over the row "
                      "→ weight {weight}",
        "neuron_missing": "q and k of this layer are not in the page (too large): open the "
                          "page on this layer to see them.",
        "export_png": "Save PNG",
        "step": "Generation step",
        "step_label": "step {n} of {N}: the KV cache holds {k} keys",
        "prompt": "prompt",
        "generated": "generated",
        "not_allowed": "not allowed (masked: this query may not see this key)",
        "not_yet": "not generated yet at this step",
        "measure": "Show",
        "measure_weights": "weights α",
        "measure_norms": "norms ‖α·v·W_O‖",
        "norms_note": "Attention weights are not explanations (Jain & Wallace 2019; "
                      "Wiegreffe & Pinter 2019 show when they can be): a large weight on a "
                      "token whose value vector is small moves little. The norms view "
                      "shows ‖α_ij · v_j · W_O‖, what each key really adds to the output "
                      "(Kobayashi et al. 2020); the lens's ablation shows what the model "
                      "needs.",
        "segments": "Sentences",
        "segment_options": {"all": "all", "AA": "A → A", "AB": "A → B", "BA": "B → A",
                            "BB": "B → B"},
        "overlay_heads": "Heads overlaid",
        "kv_group": "KV head {n}",
        "sink_title": "Attention sinks",
        "sink_mark": "sink: {share} of the weight on average",
        "sink_note": "Marked columns (▼) take much of every row's weight. Softmax makes each "
                     "row sum to 1, so a head with nothing useful to read must still put its "
                     "weight somewhere; models learn to park it on the first token(s), which "
                     "every query can see (attention sinks, Xiao et al. 2023). Such weight "
                     "often moves little: compare with the norms view.",
        "scale_low": "0", "scale_high": "max {v}",
        "flag_text": {name: text["en"] for name, text in FLAG_TEXT.items()},
        "legend": (
            f"near uniform: entropy > {NEAR_UNIFORM_ENTROPY}; over-sparse: max weight > "
            f"{OVER_SPARSE_MAX_WEIGHT} or entropy < {OVER_SPARSE_ENTROPY} (the rule misfires on "
            "positional heads such as previous-token, one-hot by design: shown as such); sink: > "
            f"{SINK_SHARE} on [CLS]/[SEP]; previous-token / next-token / self: that weight > "
            f"{POSITIONAL_HEAD_SCORE}; "
            f"near-duplicate heads: JS distance < {NEAR_DUPLICATE_JS}."
        ),
    },
    "zh": {
        "title": "注意力查看器",
        "layer": "层",
        "head": "头",
        "layer_option": "第 {n} 层",
        "head_option": "第 {n} 个头",
        "head_view": "注意力连线",
        "head_view_hint": "把鼠标移到词元上：连线表示它关注哪些词元（越不透明，权重越大）。",
        "queries": "查询 (Query)",
        "keys": "键 (Key)",
        "heatmap": "注意力权重",
        "heatmap_hint": "行 = 查询，列 = 键；每行之和为 1。鼠标移到格子上可看数值；"
                        "点击查询词元可同时保留多行。",
        "diagnostics": "诊断",
        "overview": "全部注意力头",
        "overview_hint": "点击一个头即可查看；取消勾选可隐藏某些层或头。",
        "rollout": "注意力展开（rollout）",
        "rollout_hint": "经过所有层之后，每个输出位置从每个输入词元汲取了多少信息"
                        "（Abnar 与 Zuidema 2020：各头取平均，残差占一半）。",
        "importance": "注意力头的重要性",
        "importance_hint": "关掉一个头后输出改变多少（越大 = 模型越依赖它）。点击格子查看该头。",
        "loading": "加载中…",
        "needs_js": "此页面需要 JavaScript 才能绘制注意力视图。",
        "precision_8bit": "（权重以 8 位存储：与精确值相差不超过 0.002）",
        "decode_error": "此浏览器无法解压权重数据（需要 DecompressionStream："
                        "Chrome 80+、Firefox 113+、Safari 16.4+）",
        "js_explained": "JS 距离（Jensen–Shannon 距离，以 2 为底）：两个头在各个键上分配权重的"
                        "差异，对各查询行取平均；0 = 完全相同，1 = 没有共同关注的键。",
        "this_head": "当前头",
        "this_layer": "当前层",
        "flags": "提示",
        "no_flags": "无",
        "mean_js": "头之间的平均 JS 距离",
        "closest": "最相近的两个头",
        "duplicates": "近似重复的头",
        "to_others": "当前头与其他头的 JS 距离",
        "none": "–",
        "metrics": {
            "entropy": ("归一化熵", "各行熵 / log(可关注的键数) 的平均："
                        "1 = 均匀，0 = 只看一个词元"),
            "max_weight": ("平均最大权重", "各行最大权重的平均"),
            "special_share": ("[CLS]/[SEP] 占比", "落在 [CLS]/[SEP] 上的平均权重"),
            "previous_token": ("前一个词元", "查询 i 对键 i-1 的平均权重"),
            "next_token": ("后一个词元", "查询 i 对键 i+1 的平均权重"),
            "self_token": ("自身", "查询 i 对键 i 的平均权重"),
        },
        "neuron_view": "神经元视图",
        "neuron_hint": "当前头的一个查询和一个键：q、k 以及它们在每个维度上的乘积。"
                       "乘积之和 × 缩放系数就是分数（logit），softmax 把它变成权重。"
                       "点击热力图中的格子来选择这一对。",
        "neuron_query": "查询", "neuron_key": "键",
        "neuron_dims": "维度", "neuron_q": "q", "neuron_k": "k", "neuron_qk": "q·k",
        "neuron_sum": "q·k = {dot}；× 缩放 {scale} = 分数 {logit}；对整行做 softmax "
                      "→ 权重 {weight}",
        "neuron_missing": "页面里没有这一层的 q 和 k（数据太大）：以这一层打开页面才能看到。",
        "export_png": "保存 PNG",
        "step": "生成步骤",
        "step_label": "第 {n} 步（共 {N} 步）：KV 缓存中有 {k} 个键",
        "prompt": "提示词",
        "generated": "生成的",
        "not_allowed": "不允许（被掩码：这个查询看不到这个键）",
        "not_yet": "这一步还没有生成",
        "measure": "显示",
        "measure_weights": "权重 α",
        "measure_norms": "范数 ‖α·v·W_O‖",
        "norms_note": "注意力权重并不等于解释（Jain 与 Wallace 2019；Wiegreffe 与 Pinter "
                      "2019 说明了它在什么情况下可以算作解释）：权重很大、但值向量很小的词元，"
                      "传递的信息很少。范数视图显示 ‖α_ij · v_j · W_O‖，即每个键对输出的真实"
                      "贡献（Kobayashi 等 2020）；透镜（lens）中的消融则显示模型真正依赖什么。",
        "segments": "句子",
        "segment_options": {"all": "全部", "AA": "A → A", "AB": "A → B", "BA": "B → A",
                            "BB": "B → B"},
        "overlay_heads": "叠加显示的头",
        "kv_group": "第 {n} 个 KV 头",
        "sink_title": "注意力停靠点（sink）",
        "sink_mark": "停靠点：平均占 {share} 的权重",
        "sink_note": "带 ▼ 标记的列占了每一行的大部分权重。softmax 让每行之和为 1，"
                     "所以一个没有有用信息可读的头也必须把权重放在某处；模型学会把它放在"
                     "每个查询都能看到的第一个（或前几个）词元上（attention sink，Xiao 等 2023；"
                     "《动手学深度学习》的“注意力汇聚”指的是加权求和，不是它）。"
                     "这些权重往往传递很少的信息：可与范数视图对比。",
        "scale_low": "0", "scale_high": "最大 {v}",
        "flag_text": {name: text["zh"] for name, text in FLAG_TEXT.items()},
        "legend": (
            f"近似均匀：熵 > {NEAR_UNIFORM_ENTROPY}；过度稀疏：最大权重 > {OVER_SPARSE_MAX_WEIGHT} "
            f"或熵 < {OVER_SPARSE_ENTROPY}（这条规则会误报“前一个词元”这类按位置关注的头，"
            f"它们本来就是 one-hot，表中另行标出）；"
            f"停靠在特殊词元（sink）：[CLS]/[SEP] 占比 > {SINK_SHARE}；"
            f"关注前一个词元 / 后一个词元 / 自身：对应的平均权重 > {POSITIONAL_HEAD_SCORE}；"
            f"近似重复：JS 距离 < {NEAR_DUPLICATE_JS}。"
        ),
    },
}

#: The words of the concept pictures (``attnlab draw``, :mod:`attnlab.report.concepts`).
CONCEPT_WORDS: dict[str, dict[str, str]] = {
    "en": {
        "flash_title": "Flash attention: one key tile at a time, never the whole (T, S) matrix",
        "flash_tile": "Step {n}: keys {k0}–{k1}",
        "flash_max": "running max m",
        "flash_sum": "running sum l = Σ exp(s − m)",
        "flash_note": "Grey: tiles not read yet. Each step rescales what it has by "
                      "exp(m_old − m_new); after the last tile, acc / l is exactly softmax·V.",
        "query": "query", "key": "key", "position": "position", "slot": "slot",
        "step": "step",
        "kv_title": "KV cache: decoding one token at a time",
        "kv_full": "Full cache: step t stores k_t, v_t and keeps every earlier one",
        "kv_window": "Rolling window W = {W}: position p lives in slot p mod W",
        "kv_weights": "the new query's weights over the keys it sees",
        "kv_note": "Numbers: the position a slot holds. Without a cache each step would "
                   "recompute K and V for every earlier token.",
        "pos_title": "Positional encodings",
        "pos_table": "Sinusoidal table pe (position × dim)",
        "pos_similarity": "pe · peᵀ: nearby positions look alike",
        "rope_angles": "RoPE: angle of each feature pair (position × pair)",
        "rope_scores": "RoPE: one vector at every position, scores depend on m − n only",
        "dim": "dim", "pair": "pair",
        "sparse_title": "Sparse and low-rank attention: which keys each query keeps",
        "window_causal": "Causal window W = {window}: keeps {kept} of {total} scores",
        "window_global": "Window W = {window} + global token 0: keeps {kept} of {total}",
        "bigbird": "BigBird blocks of {block_size}: keeps {kept} of {total}",
        "exact": "Exact weights (all keys)",
        "linformer": "Linformer, rank {rank}: keys pooled into {rank} summaries",
        "nystrom": "Nyström, {rank} landmarks: weights of rank ≤ {rank}",
        "df_title": "Multi-head attention: the data flow and the shape of every tensor",
        "df_legend": "T = {T} tokens, H = {H} heads, E = d_model = {E}, D = Dv = E / H = {D}",
        "df_flow": "From X to the output (one sequence, no batch axis)",
        "df_x": "X: the token vectors",
        "df_qkv": "Q = X·Wq, K = X·Wk, V = X·Wv",
        "df_split": "split into heads: view(T, H, D), transpose",
        "df_scores": "scores = Q·Kᵀ / √D (each head)",
        "df_weights": "weights = softmax(scores): each row sums to 1",
        "df_heads": "each head's output = weights·V",
        "df_concat": "concatenate: transpose back, reshape",
        "df_out": "output = concat·Wo",
        "df_attention": "multi-head attention",
        "df_norm": "LayerNorm", "df_add": "+ (residual)",
        "df_block_out": "block output", "df_residual": "residual: x skips the sublayer",
        "df_post": "Post-LN (article 001, the original Transformer)",
        "df_pre": "Pre-LN (GPT-2 and later)",
        "df_post_formula": "LayerNorm(x + attention(x))",
        "df_pre_formula": "x + attention(LayerNorm(x))",
    },
    "zh": {
        "flash_title": "Flash Attention：每次只处理一块键，从不保存完整的 (T, S) 矩阵",
        "flash_tile": "第 {n} 步：键 {k0}–{k1}",
        "flash_max": "运行最大值 m",
        "flash_sum": "运行和 l = Σ exp(s − m)",
        "flash_note": "灰色：尚未读取的块。每一步把已有结果乘以 exp(m_旧 − m_新) 重新缩放；"
                      "读完最后一块后，acc / l 恰好等于 softmax·V。",
        "query": "查询", "key": "键", "position": "位置", "slot": "槽位",
        "step": "步",
        "kv_title": "KV 缓存：逐个词元解码",
        "kv_full": "完整缓存：第 t 步存入 k_t、v_t，并保留之前所有的",
        "kv_window": "滚动窗口 W = {W}：位置 p 存放在槽位 p mod W",
        "kv_weights": "新查询对它能看到的键的注意力权重",
        "kv_note": "数字：槽位中存放的位置。没有缓存时，每一步都要为之前所有词元重新计算 K 和 V。",
        "pos_title": "位置编码",
        "pos_table": "正弦位置编码表 pe（位置 × 维度）",
        "pos_similarity": "pe · peᵀ：相近的位置彼此相似",
        "rope_angles": "RoPE：每对特征的旋转角度（位置 × 特征对）",
        "rope_scores": "RoPE：同一个向量放在各个位置，分数只取决于 m − n",
        "dim": "维度", "pair": "特征对",
        "sparse_title": "稀疏注意力与低秩近似：每个查询保留哪些键",
        "window_causal": "因果滑动窗口 W = {window}：保留 {total} 个分数中的 {kept} 个",
        "window_global": "窗口 W = {window} + 全局词元 0：保留 {total} 个中的 {kept} 个",
        "bigbird": "BigBird 块稀疏（块大小 {block_size}）：保留 {total} 个中的 {kept} 个",
        "exact": "精确的注意力权重（全部键）",
        "linformer": "Linformer，秩 {rank}：键被汇总为 {rank} 个",
        "nystrom": "Nyström，{rank} 个地标：权重的秩 ≤ {rank}",
        "df_title": "多头注意力：数据流和每个张量的形状",
        "df_legend": "T = {T} 个词元，H = {H} 个头，E = d_model = {E}，D = Dv = E / H = {D}",
        "df_flow": "从 X 到输出（一个序列，不含批量维）",
        "df_x": "X：词元的向量",
        "df_qkv": "Q = X·Wq，K = X·Wk，V = X·Wv",
        "df_split": "拆成多个头：view(T, H, D)，再 transpose",
        "df_scores": "分数 = Q·Kᵀ / √D（每个头各算一次）",
        "df_weights": "注意力权重 = softmax(分数)：每行和为 1",
        "df_heads": "每个头的输出 = 权重·V",
        "df_concat": "拼接：transpose 回来，再 reshape",
        "df_out": "输出 = 拼接结果·Wo",
        "df_attention": "多头注意力",
        "df_norm": "层规范化 LayerNorm", "df_add": "+（残差）",
        "df_block_out": "块的输出", "df_residual": "残差连接：x 绕过子层",
        "df_post": "后置规范化 Post-LN（原文 001，最初的 Transformer）",
        "df_pre": "前置规范化 Pre-LN（GPT-2 及之后）",
        "df_post_formula": "LayerNorm(x + attention(x))",
        "df_pre_formula": "x + attention(LayerNorm(x))",
    },
}
