"""The words of the head diagnostics and the viewer, in English and Chinese: each flag's
name, the tables' column headings and notes, and the viewer page's interface text.
Re-exported by :mod:`attnlab.report.words`.
"""

from __future__ import annotations

from typing import Any

from ..lens.diagnostics import (
    NEAR_DUPLICATE_JS,
    NEAR_UNIFORM_ENTROPY,
    OVER_SPARSE_ENTROPY,
    OVER_SPARSE_MAX_WEIGHT,
    POSITIONAL_HEAD_SCORE,
    SINK_SHARE,
)

__all__ = ["COLUMN_NOTES", "FLAG_TEXT", "HEAD_COLUMNS", "LAYER_COLUMNS", "LIST_SEP",
           "VIEWER_WORDS"]

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
