"""The explainer: every step present, numbers equal the library's attention, exports."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import attnlab
from attnlab import AttnlabError, ShapeError, explain
from attnlab.report import (
    step_note,
    to_json,
    to_markdown,
    to_text,
    view,
)
from attnlab.report.text import display_width


def test_default_is_seed000_example_with_all_steps():
    trace = explain()
    keys = [s.key for s in trace]
    assert keys == ["X", "Wq", "Wk", "Wv", "Q", "K", "V", "scores", "scaled", "weights", "output"]
    np.testing.assert_array_equal(trace.get("X").values,
                                  [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]])
    assert trace.get("Wq").shape == (4, 3) and trace.get("weights").shape == (3, 3)
    assert trace.tokens == ["word1", "word2", "word3"]


def test_steps_are_consistent_with_each_other_and_with_the_library():
    trace = explain(seed=3)
    X, Wq, Wk, Wv = (trace.get(k).values for k in ("X", "Wq", "Wk", "Wv"))
    Q, K = X @ Wq, X @ Wk
    np.testing.assert_allclose(trace.get("Q").values, Q, atol=1e-14)
    np.testing.assert_allclose(trace.get("scores").values, Q @ K.T, atol=1e-13)
    np.testing.assert_allclose(trace.get("scaled").values, Q @ K.T / np.sqrt(3), atol=1e-13)
    np.testing.assert_allclose(trace.output, attnlab.self_attention(X, Wq, Wk, Wv), atol=1e-12)
    assert trace.meta["scale"] == pytest.approx(1 / np.sqrt(3))


def test_same_seed_same_numbers_other_seed_other_numbers():
    a, b, c = explain(seed=5), explain(seed=5), explain(seed=6)
    np.testing.assert_array_equal(a.output, b.output)
    assert not np.allclose(a.output, c.output)


def test_multi_head_causal_trace_matches_a_hand_computation():
    trace = explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True, d_k=3, seed=1)
    assert trace.heads == [0, 1]
    masked = trace.get("masked", head=0).values
    assert np.isneginf(masked[0, 1]) and np.isneginf(masked[0, 2])
    weights = trace.weights()
    assert weights.shape == (2, 3, 3)
    np.testing.assert_array_equal(np.triu(weights, 1), 0.0)
    # explain runs attnlab's own MultiHeadAttention: check it against seed 000's loop, written
    # out here in float64 (1e-12: a few roundings of sums of three products).
    X, Wq, Wk, Wv = (trace.get(k).values for k in ("X", "Wq", "Wk", "Wv"))
    heads = []
    for h in range(2):
        cols = slice(3 * h, 3 * h + 3)
        Q, K, V = X @ Wq[:, cols], X @ Wk[:, cols], X @ Wv[:, cols]
        scores = np.where(np.tril(np.ones((3, 3), bool)), Q @ K.T / np.sqrt(3), -np.inf)
        w = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads.append((w / w.sum(axis=1, keepdims=True)) @ V)
    np.testing.assert_allclose(trace.get("concat").values, np.concatenate(heads, axis=1),
                               atol=1e-12)


def test_output_projection_with_wo():
    rng = np.random.default_rng(0)
    Wo = rng.standard_normal((6, 4))
    trace = explain(num_heads=2, Wo=Wo)
    np.testing.assert_allclose(trace.output, trace.get("concat").values @ Wo, atol=1e-13)


def test_token_embeddings_are_deterministic_per_token():
    a = attnlab.token_embeddings(["小明", "去了", "小明"])
    np.testing.assert_array_equal(a[0], a[2])
    assert not np.allclose(a[0], a[1])
    np.testing.assert_array_equal(attnlab.token_embeddings(["学校"]), attnlab.token_embeddings(
        ["学校"]))


def test_text_in_english_and_chinese():
    trace = explain(tokens=["小明", "去了", "学校"], is_causal=True)
    en = to_text(trace, "en")
    zh = to_text(trace, "zh")
    for needle in ("Step 1 · Input X", "Scores Q·Kᵀ", "row sums", "-∞", "shape (3, 3)", "小明"):
        assert needle in en
    for needle in ("第 1 步 · 输入 X", "注意力权重", "每行之和", "形状 (3, 3)", "去了"):
        assert needle in zh
    # Each weights row is printed with its sum, 1.0000.
    weights_block = en.split("Attention weights")[1].split("Step")[0]
    assert weights_block.count("1.0000") >= 3
    # Chinese punctuation in the Chinese text: full-width colon and brackets.
    assert "词元：小明 | 去了 | 学校" in zh


def test_text_tables_line_up_with_cjk_tokens():
    """Column labels sit over their numbers, counting a CJK character as two columns."""
    zh = to_text(explain(tokens=["小明", "去了", "学校"]), "zh").splitlines()
    header = next(i for i, line in enumerate(zh) if line.rstrip().endswith("每行之和"))
    row = zh[header + 1]  # "  小明 [0.2... 0.3... 0.4...]   1.0000"
    top = zh[header]
    label_ends = [display_width(top[:top.index(t) + len(t)]) for t in ("小明", "去了", "学校")]
    inside = row.index("[") + 1
    cell_ends = [display_width(row[:inside + m.end()])
                 for m in re.finditer(r"\S+", row[inside:row.index("]")])]
    assert label_ends == cell_ends
    sums_at = display_width(top[:top.index("每行之和")])
    assert sums_at == display_width(row[:row.rindex("1.0000")])


def test_step_notes_are_true_and_multi_head_steps_are_labelled():
    trace = explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True)
    en, zh = to_text(trace, "en"), to_text(trace, "zh")
    # The scaling step names the real reason: variance growing with d_k, softmax saturation.
    scaled = trace.get("scaled")
    scaled_en, scaled_zh = step_note(scaled, "en"), step_note(scaled, "zh")
    assert "variance" in scaled_en and "saturate" in scaled_en
    assert "方差" in scaled_zh and "饱和" in scaled_zh
    assert "Step 5 · Queries Q [head 1]" in en
    assert "第 5 步 · 查询 Q（第 1 个头）" in zh
    # Each head's Q, K, V use that head's columns of Wq, Wk, Wv.
    assert "Q = X·Wq[:, 3:6]" in en and "Wq: E × H·d_k = 4 × 2·3" in en
    assert trace.get("concat").formula == "concat = [head_1 | head_2]"


def test_summary_names_the_most_attended_token_per_head():
    trace = explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True)
    en, zh, md = to_text(trace, "en"), to_text(trace, "zh"), to_markdown(trace, "zh")
    for h in (0, 1):
        w = trace.get("weights", head=h).values
        tokens = trace.tokens
        pairs = [f"{tokens[i]} → {tokens[int(w[i].argmax())]} ({w[i].max():.4f})"
                 for i in range(3)]
        assert f"head {h + 1}: " + "   ".join(pairs) in en
        assert f"第 {h + 1} 个头：" + "   ".join(pairs) in zh
        assert f"- 第 {h + 1} 个头：" + " · ".join(pairs) in md
    lines = en.splitlines()
    assert lines[lines.index("== Summary ==") + 4] == ""  # note line + two heads, then notes
    assert "小明 → 小明 (1.0000)" in zh  # causal: the first token can only see itself
    one_head = to_text(explain(), "en").splitlines()
    summary = one_head.index("== Summary ==")
    assert one_head[summary + 2].startswith("  word1 → ")  # one head: no head label


def test_json_roundtrip_and_minus_inf_as_null():
    trace = explain(is_causal=True)
    data = json.loads(to_json(trace))
    assert [s["key"] for s in data["steps"]] == [s.key for s in trace]
    masked = next(s for s in data["steps"] if s["key"] == "masked")
    assert masked["values"][0][1] is None  # -inf is not JSON: written as null
    weights = next(s for s in data["steps"] if s["key"] == "weights")
    np.testing.assert_allclose(weights["values"], trace.get("weights").values, atol=0)
    assert weights["title"]["zh"] == "注意力权重"
    assert data["meta"]["is_causal"] is True
    # The trace itself is data: its own dict has the same steps and numbers, no titles.
    plain = json.loads(trace.to_json())
    assert "title" not in plain["steps"][0]
    assert [{k: v for k, v in step.items() if k != "title"} for step in data["steps"]] \
        == plain["steps"]


def test_markdown_has_one_table_per_step_and_escapes_tokens():
    trace = explain(tokens=["a|b", "<i>", "c"])
    md = to_markdown(trace, "en")
    assert md.count("\n## Step ") == len(trace)
    assert md.count("\n## ") == len(trace) + 2 and "\n## Summary\n" in md and "\n## Notes\n" in md
    assert "a\\|b" in md and "&lt;i&gt;" in md and "<i>" not in md
    assert "| row sums |" in md


def test_explain_validation():
    with pytest.raises(AttnlabError, match="tokens: expected 3 labels to match X's rows, got 2"):
        explain(tokens=["a", "b"], X=np.ones((3, 4)))
    with pytest.raises(ShapeError, match=r"Wq: expected \(E, H\*d_k\) = \(4, 3\)"):
        explain(Wq=np.ones((4, 2)))
    with pytest.raises(ShapeError, match=r"X: expected \(T, E\), got \(4\)"):
        explain(X=np.ones(4))
    with pytest.raises(AttnlabError, match="num_heads: expected an integer >= 1, got 0"):
        explain(num_heads=0)
    with pytest.raises(ShapeError, match=r"Wo: expected \(H\*d_k, E_out\) = \(3, E_out\)"):
        explain(Wo=np.eye(4))
    with pytest.raises(AttnlabError, match="lang: expected 'en' or 'zh', got 'fr'"):
        to_text(explain(), "fr")  # type: ignore[arg-type]
    with pytest.raises(AttnlabError, match="key: expected one of"):
        explain().get("nope")


def test_view_of_a_trace_shows_in_jupyter():
    trace = explain(tokens=["小明", "去了", "学校"], num_heads=2)
    assert trace.attention().shape == (1, 2, 3, 3)
    html = view(trace)._repr_html_()
    assert html.startswith("<iframe") and "srcdoc=" in html
    assert "小明" in view(trace).html
    no_weights = attnlab.Trace(steps=[trace.get("X")], tokens=trace.tokens)
    with pytest.raises(AttnlabError, match="expected a trace holding 'weights' steps"):
        no_weights.attention()
    with pytest.raises(AttnlabError, match="expected a trace holding 'weights' steps"):
        view(no_weights)


def test_the_trace_module_holds_no_words_and_imports_no_renderer():
    import ast
    import inspect

    import attnlab.trace

    source = inspect.getsource(attnlab.trace)
    imported = {node.module for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.Import) for alias in node.names}
    assert not any(name and ("report" in name or "matplotlib" in name) for name in imported)
    assert "注意力" not in source and not hasattr(attnlab.Trace, "to_text")


def test_tokens_must_be_a_list_not_a_string():
    """A string was split into characters; non-str tokens crashed with AttributeError."""
    with pytest.raises(AttnlabError, match="tokens: expected a list of tokens, got the string"):
        explain(tokens="the cat sat")
    with pytest.raises(AttnlabError, match="tokens: expected a list of tokens, got int"):
        explain(tokens=3)  # type: ignore[arg-type]
    trace = explain(tokens=[1, 2, 3])  # type: ignore[list-item]
    assert trace.tokens == ["1", "2", "3"]
    same = attnlab.token_embeddings([1, 2]) == attnlab.token_embeddings(["1", "2"])  # type: ignore[list-item]
    assert same.all()
