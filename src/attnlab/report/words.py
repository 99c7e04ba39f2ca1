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

__all__ = ["Lang", "LANGS", "STEP_TEXT", "TRACE_WORDS", "FLAG_TEXT", "HEAD_COLUMNS",
           "LAYER_COLUMNS", "LIST_SEP", "VIEWER_WORDS"]

Lang = Literal["en", "zh"]
LANGS = ("en", "zh")

#: Title and one-line explanation of each step kind, in English and Chinese.
#: Every note must be true of any trace: ``explain``'s (random weights, one layer)
#: and a trained model's (learned weights, several layers).
STEP_TEXT: dict[str, dict[str, tuple[str, str]]] = {
    "X": {
        "en": ("Input X", "one row per token: its vector (an embedding, or the previous "
               "layer's output)"),
        "zh": ("输入 X", "每一行是一个词（token）的向量：词嵌入，或上一层的输出"),
    },
    "Wq": {
        "en": ("Query weights Wq", "projects each token's vector into query space "
               "(a real model learns it in training)"),
        "zh": ("查询权重 Wq", "把每个词的向量投影到查询（Query）空间（真实模型中由训练学得）"),
    },
    "Wk": {
        "en": ("Key weights Wk", "projects each token's vector into key space "
               "(a real model learns it in training)"),
        "zh": ("键权重 Wk", "把每个词的向量投影到键（Key）空间（真实模型中由训练学得）"),
    },
    "Wv": {
        "en": ("Value weights Wv", "projects each token's vector into value space "
               "(a real model learns it in training)"),
        "zh": ("值权重 Wv", "把每个词的向量投影到值（Value）空间（真实模型中由训练学得）"),
    },
    "Q": {
        "en": ("Queries Q", "what each token is looking for (like a search query)"),
        "zh": ("查询 Q", "每个词想“找”什么，相当于搜索请求"),
    },
    "K": {
        "en": ("Keys K", "what each token can be found by (like a document's index terms)"),
        "zh": ("键 K", "每个词供查询来匹配的“索引关键词”"),
    },
    "V": {
        "en": ("Values V", "the content each token passes on when it is attended to"),
        "zh": ("值 V", "每个词被关注时真正传递出去的内容"),
    },
    "scores": {
        "en": ("Scores Q·Kᵀ", "row i, column j: dot product of token i's query and "
               "token j's key, i.e. how well they match"),
        "zh": ("注意力分数 Q·Kᵀ", "第 i 行第 j 列：第 i 个词的查询与第 j 个词的键的点积，"
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
        "zh": ("掩码后的分数", "被屏蔽的位置（如因果掩码下排在后面的词）设为 -∞，"
               "softmax 后权重为 0"),
    },
    "weights": {
        "en": ("Attention weights", "softmax of each row: every weight ≥ 0, each row sums "
               "to 1; row i is how token i divides its attention"),
        "zh": ("注意力权重", "对每一行做 softmax：权重都 ≥ 0，每行之和为 1；"
               "第 i 行就是第 i 个词的注意力分配"),
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

TRACE_WORDS = {
    "en": {"head": "head", "layer": "layer", "shape": "shape", "colon": ": ",
           "row_sums": "row sums", "tokens": "Tokens", "trace": "Attention trace",
           "summary": "Summary", "summary_note": "Each token → the token it attends to "
           "most (the largest weight in its row)"},
    "zh": {"head": "头", "layer": "层", "shape": "形状", "colon": "：",
           "row_sums": "每行之和", "tokens": "词", "trace": "注意力计算过程",
           "summary": "小结", "summary_note": "每个词 → 它最关注的词（该行中最大的注意力权重）"},
}

#: The name of each diagnostic flag (keys of ``HeadDiagnostics.flags``).
FLAG_TEXT = {
    "near_uniform": {"en": "near uniform", "zh": "近似均匀"},
    "over_sparse": {"en": "over-sparse", "zh": "过度稀疏"},
    "sink": {"en": "sink", "zh": "汇聚到特殊词"},
    "previous_token": {"en": "previous-token", "zh": "关注前一个词"},
    "next_token": {"en": "next-token", "zh": "关注后一个词"},
    "self": {"en": "self", "zh": "关注自身"},
}
#: Column headings of the diagnostics tables: one row per head, one per layer.
HEAD_COLUMNS = {
    "en": ["layer", "head", "entropy", "max w", "[CLS]/[SEP]", "prev", "next", "self",
           "flags"],
    "zh": ["层", "头", "归一化熵", "平均最大权重", "[CLS]/[SEP] 占比", "前一个词", "后一个词",
           "自身", "提示"],
}
LAYER_COLUMNS = {
    "en": ["layer", "mean JS distance", "closest heads", "near-duplicate heads"],
    "zh": ["层", "平均 JS 距离", "最相近的两个头", "近似重复的头"],
}
LIST_SEP = {"en": ", ", "zh": "、"}  # between flags, between head pairs

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
        "flag_text": {name: text["en"] for name, text in FLAG_TEXT.items()},
        "legend": (
            f"near uniform: entropy > {NEAR_UNIFORM_ENTROPY}; over-sparse: max weight > "
            f"{OVER_SPARSE_MAX_WEIGHT} or entropy < {OVER_SPARSE_ENTROPY}; sink: > "
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
        "head_view_hint": "把鼠标移到词上：连线表示它关注哪些词（越不透明，权重越大）。",
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
            "entropy": ("归一化熵", "各行熵 / log(可关注的键数) 的平均：1 = 均匀，0 = 只看一个词"),
            "max_weight": ("平均最大权重", "各行最大权重的平均"),
            "special_share": ("[CLS]/[SEP] 占比", "落在 [CLS]/[SEP] 上的平均权重"),
            "previous_token": ("前一个词", "查询 i 对键 i-1 的平均权重"),
            "next_token": ("后一个词", "查询 i 对键 i+1 的平均权重"),
            "self_token": ("自身", "查询 i 对键 i 的平均权重"),
        },
        "flag_text": {name: text["zh"] for name, text in FLAG_TEXT.items()},
        "legend": (
            f"近似均匀：熵 > {NEAR_UNIFORM_ENTROPY}；过度稀疏：最大权重 > {OVER_SPARSE_MAX_WEIGHT} "
            f"或熵 < {OVER_SPARSE_ENTROPY}；汇聚到特殊词：[CLS]/[SEP] 占比 > {SINK_SHARE}；"
            f"关注前一个词 / 后一个词 / 自身：对应的平均权重 > {POSITIONAL_HEAD_SCORE}；"
            f"近似重复：JS 距离 < {NEAR_DUPLICATE_JS}。"
        ),
    },
}
