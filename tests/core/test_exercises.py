# ruff: noqa: E501, E741  (a table of mistakes reads best one per line; l is the paper's name)
"""attnlab.exercises accepts right solutions and names each typical mistake, in both languages.

Every solution here is written from the seeds' formulas (NumPy lines as a learner
types them), never by calling attnlab: the checker's verdict is compared with what
a teacher would say. A hint is judged by a phrase a teacher would use, in Chinese
and in English.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import AttnlabError, exercises

# ------------------------------------------------------------------ right solutions


def qkv(X, Wq, Wk, Wv):
    return np.dot(X, Wq), np.dot(X, Wk), np.dot(X, Wv)  # seed 000, section 2


def scores(Q, K):
    return np.dot(Q, K.T)


def scaled_scores(Q, K):
    d_k = K.shape[1]  # seed 000: "K的维度"
    return np.dot(Q, K.T) / np.sqrt(d_k)


def softmax(x):
    e = np.exp(x - np.max(x, axis=1, keepdims=True))
    return e / np.sum(e, axis=1, keepdims=True)


def attention(Q, K, V):
    return softmax(scaled_scores(Q, K)) @ V


def self_attention(X, Wq, Wk, Wv):
    return attention(X @ Wq, X @ Wk, X @ Wv)


def causal_mask(T):
    return np.tril(np.ones((T, T), dtype=bool))


def padding_mask(valid_lens, S):
    return np.array([[j < n for j in range(S)] for n in valid_lens], dtype=bool).reshape(-1, S)


def masked_attention(Q, K, V, mask):
    s = np.where(mask, scaled_scores(Q, K), -np.inf)
    top = np.max(s, axis=1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))  # a fully masked row: all exp(-inf) = 0
    total = e.sum(axis=1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return w @ V


def split_heads(x, num_heads):
    B, T, E = x.shape
    return x.reshape(B, T, num_heads, E // num_heads).transpose(0, 2, 1, 3)  # seed 001's view


def merge_heads(x):
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


def multi_head_attention(X, Wq, Wk, Wv, Wo, num_heads):
    heads = []
    D = X.shape[1] // num_heads
    for h in range(num_heads):  # seed 000: independent heads, concatenated
        cols = slice(h * D, (h + 1) * D)
        heads.append(attention(X @ Wq[:, cols], X @ Wk[:, cols], X @ Wv[:, cols]))
    return np.concatenate(heads, axis=1) @ Wo


def sinusoidal_encoding(max_len, d_model):
    pe = np.zeros((max_len, d_model))
    position = np.arange(max_len)[:, None]
    div_term = np.exp(np.arange(0, d_model, 2) * -(np.log(10000.0) / d_model))  # seed 001
    pe[:, 0::2] = np.sin(position * div_term)
    pe[:, 1::2] = np.cos(position * div_term)
    return pe


def layer_norm(x):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5)


def residual_block(x, attention, layer_norm, norm):
    if norm == "post":
        return layer_norm(x + attention(x))
    return x + attention(layer_norm(x))


def online_attention(q, K, V, block):
    m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])  # FlashAttention's running max, sum, output
    for start in range(0, len(K), block):
        s = K[start:start + block] @ q / np.sqrt(len(q))
        m_new = max(m, s.max())
        p = np.exp(s - m_new)
        l = l * np.exp(m - m_new) + p.sum()
        acc = acc * np.exp(m - m_new) + p @ V[start:start + block]
        m = m_new
    return acc / l


def softmax_backward(y, dy):
    # Jacobian dy_i/dx_j = y_i (delta_ij - y_j), applied row by row, written out
    out = np.zeros_like(y)
    for t in range(y.shape[0]):
        jacobian = np.diag(y[t]) - np.outer(y[t], y[t])
        out[t] = jacobian.T @ dy[t]
    return out


def attention_with_sink(Q, K, V, sink):
    # Hugging Face's GPT-OSS eager attention: the sink as one more column of logits,
    # softmax with the row's max subtracted, the sink's column dropped before @ V
    scores = Q @ K.T / np.sqrt(K.shape[1])                               # (T, S)
    logits = np.concatenate([scores, np.full((len(Q), 1), sink)], axis=1)  # (T, S + 1)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True))[:, :-1] @ V                # (T, Dv)


def _plain_attention(Q, K, V, sink):
    return softmax(scaled_scores(Q, K)) @ V


def _sink_renormalised(Q, K, V, sink):
    weights = attention_with_sink(Q, K, np.eye(K.shape[0]), sink)  # the kept columns (T, S)
    return weights / weights.sum(axis=1, keepdims=True) @ V


def _sink_unshifted(Q, K, V, sink):
    e = np.exp(scaled_scores(Q, K))
    return e / (e.sum(axis=1, keepdims=True) + np.exp(sink)) @ V


RIGHT = {
    "qkv": qkv, "scores": scores, "scaled_scores": scaled_scores, "softmax": softmax,
    "attention": attention, "self_attention": self_attention, "causal_mask": causal_mask,
    "padding_mask": padding_mask, "masked_attention": masked_attention,
    "split_heads": split_heads, "merge_heads": merge_heads,
    "multi_head_attention": multi_head_attention, "sinusoidal_encoding": sinusoidal_encoding,
    "layer_norm": layer_norm, "residual_block": residual_block,
    "online_attention": online_attention, "softmax_backward": softmax_backward,
    "attention_with_sink": attention_with_sink,
}


def test_every_exercise_has_a_right_solution_here():
    assert exercises.names() == list(RIGHT)


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize("name", list(RIGHT))
def test_a_right_solution_passes(name, lang):
    result = exercises.check(name, RIGHT[name], lang=lang)
    assert result.passed and result.mistake == "ok", result.hint
    assert ("正确" if lang == "zh" else "Correct") in result.hint


# ------------------------------------------------------------------ typical mistakes

def naive_softmax(x):  # seed 000's line: no max subtracted
    return np.exp(x) / np.sum(np.exp(x), axis=1, keepdims=True)


def seed000_masked(Q, K, V, mask):  # seed 000: additive -1e9, then a max-subtracted softmax
    return softmax(scaled_scores(Q, K) + (1 - mask) * -1e9) @ V


def _heads_reshaped(X, Wq, Wk, Wv, Wo, num_heads):
    T, E = X.shape
    D = E // num_heads
    q, k, v = ((X @ W).reshape(num_heads, T, D) for W in (Wq, Wk, Wv))
    out = [attention(q[h], k[h], v[h]) for h in range(num_heads)]
    return np.concatenate(out, axis=1) @ Wo


def _pe(first, second, exponent, start=0, halves=False):
    def wrong(max_len, d_model):
        pos = np.arange(start, start + max_len)[:, None]
        i = np.arange(d_model // 2)
        angle = pos / 10000 ** (exponent(i) / d_model)
        if halves:
            return np.concatenate([first(angle), second(angle)], axis=1)
        pe = np.zeros((max_len, d_model))
        pe[:, 0::2], pe[:, 1::2] = first(angle), second(angle)
        return pe
    return wrong


def _pe_column(max_len, d_model):
    pos = np.arange(max_len)[:, None]
    cols = np.arange(d_model)
    angle = pos / 10000 ** (cols / d_model)
    return np.where(cols % 2 == 0, np.sin(angle), np.cos(angle))


def _online(*, rescale=True, shift=True, divide=True, whole_tiles_only=False):
    def wrong(q, K, V, block):
        m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])
        for start in range(0, len(K) - (block - 1 if whole_tiles_only else 0), block):
            s = K[start:start + block] @ q / np.sqrt(len(q))
            m_new = max(m, s.max()) if shift else 0.0
            c = np.exp(m - m_new) if rescale and shift else 1.0
            p = np.exp(s - m_new)
            l, acc, m = l * c + p.sum(), acc * c + p @ V[start:start + block], m_new
        return acc / l if divide else acc
    return wrong


#: (exercise, wrong solution, the mistake's key, a Chinese phrase, an English phrase)
MISTAKES = [
    ("qkv", lambda X, Wq, Wk, Wv: (Wq @ X, Wk @ X, Wv @ X), "qkv_weight_first", "X @ Wq", "X @ Wq"),
    ("qkv", lambda X, Wq, Wk, Wv: (X @ Wq.T, X @ Wk.T, X @ Wv.T), "qkv_transposed_weight",
     "不要转置", "without transposing"),
    ("qkv", lambda X, Wq, Wk, Wv: (X @ Wk, X @ Wq, X @ Wv), "qkv_order", "顺序", "order"),
    ("qkv", lambda X, Wq, Wk, Wv: X @ Wq, "qkv_not_three", "三个", "three"),
    ("scores", lambda Q, K: Q @ K, "no_transpose", "把 K 转置了吗", "transpose K"),
    ("scores", lambda Q, K: K @ Q.T, "scores_transposed", "行和列反了", "swapped"),
    ("scores", scaled_scores, "scaled_too_early", "下一步", "next step"),
    ("scaled_scores", scores, "no_scale", "没有除以 √d_k", "did not divide by √d_k"),
    ("scaled_scores", lambda Q, K: Q @ K.T / K.shape[1], "scale_by_dk", "应除以 √d_k",
     "divide by √d_k"),
    ("scaled_scores", lambda Q, K: Q @ K.T / np.sqrt(len(K)), "scale_by_length", "不是词元个数",
     "not the number of tokens"),
    ("scaled_scores", lambda Q, K: Q @ K.T * np.sqrt(K.shape[1]), "scale_multiplied", "乘以",
     "multiplied"),
    ("softmax", lambda x: np.exp(x - x.max(0)) / np.exp(x - x.max(0)).sum(0), "softmax_axis",
     "每行权重之和不是 1：softmax 的 axis 对吗？", "is softmax's axis right"),
    ("softmax", naive_softmax, "softmax_no_max", "溢出", "overflow"),
    ("softmax", lambda x: np.exp(x - x.max()) / np.sum(np.exp(x - x.max()), axis=1, keepdims=True),
     "softmax_global_max", "每一行自己的最大值", "each row's own maximum"),
    ("softmax", lambda x: np.exp(x) / np.exp(x).sum(), "softmax_global_sum", "整个矩阵", "whole matrix"),
    ("softmax", lambda x: np.exp(x - x.max(1, keepdims=True)) / np.exp(
        x - x.max(1, keepdims=True)).sum(1), "softmax_no_keepdims", "keepdims", "keepdims"),
    ("attention", lambda Q, K, V: softmax(scores(Q, K)) @ V, "no_scale", "没有除以 √d_k",
     "did not divide by √d_k"),
    ("attention", lambda Q, K, V: softmax(scaled_scores(Q, K)), "returned_weights", "weights @ V",
     "weights @ V"),
    ("attention", lambda Q, K, V: softmax(scaled_scores(Q, K)).T @ V, "weights_transposed",
     "权重转置了", "transposed"),
    ("attention", lambda Q, K, V: naive_softmax(scaled_scores(Q, K)) @ V, "softmax_no_max", "溢出",
     "overflow"),
    ("attention", lambda Q, K, V: softmax(scaled_scores(Q, K).T).T @ V, "softmax_axis",
     "axis", "axis"),
    ("self_attention", lambda X, Wq, Wk, Wv: softmax((X @ Wq) @ (X @ Wk).T) @ (X @ Wv), "no_scale",
     "没有除以 √d_k", "did not divide by √d_k"),
    ("causal_mask", lambda T: np.triu(np.ones((T, T), dtype=bool), k=1), "mask_reversed",
     "掩码方向反了：True 表示可以关注", "True means may attend"),
    ("causal_mask", lambda T: np.triu(np.ones((T, T)), k=1), "mask_seed000", "1 = 屏蔽", "1 = blocked"),
    ("causal_mask", lambda T: np.tril(np.ones((T, T), dtype=bool), k=-1), "causal_no_diagonal",
     "对角线", "diagonal"),
    ("causal_mask", lambda T: np.tril(np.ones((T, T))), "mask_not_bool", "dtype=bool", "dtype=bool"),
    ("padding_mask", lambda v, S: ~padding_mask(v, S), "mask_reversed", "掩码方向反了", "wrong way round"),
    ("padding_mask", lambda v, S: np.arange(S)[None] <= np.asarray(v)[:, None], "padding_off_by_one",
     "差了一个", "Off by one"),
    ("masked_attention", lambda Q, K, V, m: masked_attention(Q, K, V, ~m), "mask_reversed",
     "掩码方向反了", "wrong way round"),
    ("masked_attention", lambda Q, K, V, m: (softmax(scaled_scores(Q, K)) * m) @ V,
     "mask_after_softmax", "softmax 之后", "after the softmax"),
    ("masked_attention", seed000_masked, "full_row_minus_1e9", "-1e9", "-1e9"),
    ("masked_attention", lambda Q, K, V, m: softmax(np.where(m, scaled_scores(Q, K), -np.inf)) @ V,
     "full_row_nan", "NaN", "NaN"),
    ("masked_attention", lambda Q, K, V, m: masked_attention(Q * np.sqrt(K.shape[1]), K, V, m),
     "no_scale", "√d_k", "√d_k"),
    ("split_heads", lambda x, H: x.reshape(x.shape[0], H, x.shape[1], -1), "split_reshape_only",
     "transpose(0, 2, 1, 3)", "transpose(0, 2, 1, 3)"),
    ("split_heads", lambda x, H: x.reshape(x.shape[0], x.shape[1], H, -1), "split_no_transpose",
     "交换 T 和 H", "swap the T and H"),
    ("merge_heads", lambda x: x.reshape(x.shape[0], x.shape[2], -1), "merge_reshape_only",
     "transpose(0, 2, 1, 3)", "transpose(0, 2, 1, 3)"),
    ("multi_head_attention", lambda X, Wq, Wk, Wv, Wo, H: multi_head_attention(X, Wq, Wk, Wv, Wo, H)
     @ np.linalg.inv(Wo), "mha_no_wo", "Wo", "Wo"),
    ("multi_head_attention", lambda X, Wq, Wk, Wv, Wo, H: softmax(
        (X @ Wq) @ (X @ Wk).T / np.sqrt(X.shape[1] // H)) @ (X @ Wv) @ Wo, "mha_no_split",
     "没有拆成多个头", "not split"),
    # X scaled by H^(-1/4) scales every score by 1/√H, so the heads divide by √(D·H) = √E;
    # Wv scaled by H^(1/4) leaves the values as they were.
    ("multi_head_attention", lambda X, Wq, Wk, Wv, Wo, H: multi_head_attention(
        X * np.sqrt(np.sqrt(1 / H)), Wq, Wk, Wv * np.sqrt(np.sqrt(H)), Wo, H), "mha_scale_width",
     "√E", "√E"),
    ("multi_head_attention", _heads_reshaped, "mha_bad_split", "拆头", "head split"),
    ("sinusoidal_encoding", _pe(np.cos, np.sin, lambda i: 2 * i), "pe_swapped", "sin 和 cos 放反了",
     "swapped"),
    ("sinusoidal_encoding", _pe(np.sin, np.cos, lambda i: 2 * i, halves=True), "pe_halves", "交错",
     "interleaves"),
    ("sinusoidal_encoding", _pe(np.sin, np.cos, lambda i: i), "pe_pair_exponent", "2i / d_model",
     "2i / d_model"),
    ("sinusoidal_encoding", _pe_column, "pe_column_exponent", "同一个频率", "shares the frequency"),
    ("sinusoidal_encoding", _pe(np.sin, np.cos, lambda i: 2 * i, start=1), "pe_from_one",
     "从 0 开始", "start at 0"),
    ("layer_norm", lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(
        x.var(-1, ddof=1, keepdims=True) + 1e-5), "ln_unbiased", "有偏方差", "biased variance"),
    ("layer_norm", lambda x: (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5), "ln_axis", "最后一维",
     "last axis"),
    ("layer_norm", lambda x: (x - x.mean(-1, keepdims=True)) / (x.std(-1, keepdims=True) + 1e-5),
     "ln_eps_outside", "np.sqrt(var + eps)", "np.sqrt(var + eps)"),
    ("residual_block", lambda x, a, ln, norm: ln(a(x)) if norm == "post" else a(ln(x)),
     "block_no_residual", "残差", "residual"),
    ("residual_block", lambda x, a, ln, norm: residual_block(x, a, ln, "pre" if norm == "post"
                                                             else "post"), "block_swapped",
     "放反了", "swapped"),
    ("online_attention", _online(rescale=False), "online_no_correction", "np.exp(m_old - m_new)",
     "np.exp(m_old - m_new)"),
    ("online_attention", _online(shift=False), "softmax_no_max", "溢出", "overflow"),
    ("online_attention", _online(divide=False), "online_no_divide", "acc / l", "acc / l"),
    ("online_attention", _online(whole_tiles_only=True), "online_last_tile", "最后一块", "last tile"),
    ("softmax_backward", lambda y, dy: y * dy, "sb_no_subtract", "还差一项", "term is missing"),
    ("softmax_backward", lambda y, dy: y * (1 - y) * dy, "sb_diagonal", "对角线", "diagonal"),
    ("softmax_backward", lambda y, dy: y * (dy - (dy * y).sum(0)), "sb_axis", "每一行", "each row"),
    ("residual_block", lambda x, a, ln, norm: residual_block(x, a, ln, "post") if norm == "post"
     else ln(x + a(ln(x))), "block_pre_extra_norm", "不再做层规范化", "does not normalise"),
    ("attention_with_sink", _plain_attention, "sink_ignored", "普通的注意力", "plain attention"),
    # renormalising the kept columns is plain attention again: the same hint names both
    ("attention_with_sink", _sink_renormalised, "sink_ignored", "重新归一化", "renormalising"),
    ("attention_with_sink", _sink_unshifted, "softmax_no_max", "溢出", "overflow"),
]


@pytest.mark.parametrize("lang", ["zh", "en"])
@pytest.mark.parametrize(("name", "wrong", "key", "zh", "en"), MISTAKES,
                         ids=[f"{m[0]}-{m[2]}" for m in MISTAKES])
def test_a_typical_mistake_is_named(name, wrong, key, zh, en, lang):
    result = exercises.check(name, wrong, lang=lang)
    assert not result.passed
    assert result.mistake == key, result.hint
    assert (zh if lang == "zh" else en) in result.hint


def test_every_exercise_names_at_least_one_mistake_here():
    assert {m[0] for m in MISTAKES} == set(RIGHT)


def test_the_zero_eps_layer_norm_is_told_about_the_constant_row():
    def no_eps(x):
        return (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    result = exercises.check("layer_norm", no_eps)
    # With eps = 0 the random rows differ from attnlab by ~1e-5 relative, so the first
    # failing case already names the missing eps.
    assert result.mistake == "ln_no_eps" and "ε" in result.hint


# ------------------------------------------------------------------ the learner's cell never breaks

def test_the_stub_is_reported_as_not_yet_written():
    def scores(Q, K):
        raise NotImplementedError
    zh, en = exercises.check("scores", scores), exercises.check("scores", scores, lang="en")
    assert zh.mistake == en.mistake == "not_written"
    assert "还没有写" in zh.hint and "Not written yet" in en.hint


def test_a_crash_is_a_hint_not_a_traceback():
    def attention(Q, K, V):
        return undefined_name @ V  # noqa: F821  (the learner's typo)
    result = exercises.check("attention", attention, lang="en")
    assert not result.passed and result.mistake == "crashed"
    assert "NameError" in result.hint and "undefined_name" in result.hint
    zh = exercises.check("attention", attention)
    assert "出错" in zh.hint and "NameError" in zh.hint


def test_a_shape_mismatch_says_expected_and_received():
    result = exercises.check("scores", lambda Q, K: (Q @ K.T)[:, :1], lang="en")
    assert result.mistake == "shape"
    assert "expected (4, 4), got (4, 1)" in result.hint
    assert "期望 (4, 4)，得到 (4, 1)" in exercises.check("scores", lambda Q, K: (Q @ K.T)[:, :1]).hint


def test_a_value_that_is_no_array_is_said_so():
    result = exercises.check("scores", lambda Q, K: "scores", lang="en")
    assert not result.passed and result.mistake in {"not_array", "shape"}
    assert exercises.check("scores", lambda Q, K: None).passed is False


def test_unknown_wrong_values_give_the_size_of_the_error():
    result = exercises.check("scores", lambda Q, K: Q @ K.T + 0.5, lang="en")
    assert result.mistake == "wrong" and "0.5" in result.hint


def test_a_solution_that_writes_into_its_inputs_spoils_no_later_case():
    def softmax_in_place(x):
        x -= x.max(axis=1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=1, keepdims=True)
        return x
    assert exercises.check("softmax", softmax_in_place).passed


def test_not_a_function():
    result = exercises.check("scores", 42, lang="en")
    assert result.mistake == "not_callable" and "int" in result.hint


def test_bad_name_or_language_is_a_clear_error():
    with pytest.raises(AttnlabError, match="name: expected one of qkv"):
        exercises.check("sccores", scores)
    with pytest.raises(AttnlabError, match="lang: expected 'zh' or 'en', got 'fr'"):
        exercises.check("scores", scores, lang="fr")


def test_the_result_displays_itself_in_a_notebook():
    result = exercises.check("scores", lambda Q, K: Q @ K)
    assert "把 K 转置了吗" in result._repr_markdown_() and "❌" in result._repr_markdown_()
    page = exercises.check("scores", lambda Q, K: Q @ K, lang="en")._repr_html_()
    assert "<div" in page and "Did you transpose K?" in page and "http" not in page
    ok = exercises.check("scores", scores)
    assert bool(ok) and "✅" in ok._repr_markdown_() and "✓" in str(ok)
    # the learner's text (an error message) is escaped, not interpreted as HTML
    def bad(Q, K):
        raise ValueError("<script>")
    assert "&lt;script&gt;" in exercises.check("scores", bad)._repr_html_()


def test_task_gives_the_signature_with_shapes():
    assert "(T, D), (S, D) -> (T, S)" in exercises.task("scores")
    assert "True = may attend" in exercises.task("causal_mask", "en")


def test_the_hint_is_a_keyed_message_of_the_catalog():
    zh = exercises.check("scaled_scores", scores)
    en = exercises.check("scaled_scores", scores, lang="en")
    assert zh.message.key == "exercise.no_scale"
    assert zh.message.render("en") == en.hint and en.message.render("zh") == zh.hint
