"""What a learner found wrong in the lab's labels, each fixed and held here.

The expected strings are written out by hand: they are what the lesson teaches
(Wv is E × d_v; pre-LN's residual is x + attention(LayerNorm(x))).
"""

from __future__ import annotations

import numpy as np

import attnlab
from attnlab.report import step_title
from attnlab.report.words import NOTE_TEXT, STEP_TEXT


def test_wv_is_labelled_with_d_v_not_d_k():
    X = np.ones((3, 4))
    rng = np.random.default_rng(0)
    trace = attnlab.explain(X=X, Wq=rng.standard_normal((4, 3)), Wk=rng.standard_normal((4, 3)),
                            Wv=rng.standard_normal((4, 3)))
    # explain keeps d_v = d_k, but names the value width for what it is
    assert trace.get("Wv").formula == "Wv: E × d_v = 4 × 3"
    assert trace.get("Wq").formula == "Wq: E × d_k = 4 × 3"
    assert "H·d_v" in STEP_TEXT["V_all"]["en"][1] and "H·d_v" in STEP_TEXT["V_all"]["zh"][1]


def test_pre_ln_residual_is_titled_for_what_it_computes():
    pre = attnlab.explain(num_heads=2, d_k=2, Wo=True, norm="pre")
    step = pre.get("residual")
    assert step.formula == "residual = x + attention(LayerNorm(x))"
    for lang in ("en", "zh"):
        assert "attention(x)" not in step_title(step, lang)
    post = attnlab.explain(num_heads=2, d_k=2, Wo=True, norm="post")
    assert post.get("residual").formula == "residual = x + attention(x)"
    assert "Wo: H·d_v × E_out" in post.get("Wo").formula


def test_chinese_text_says_yuanwen_and_uses_d2l_terms():
    chinese = " ".join(v["zh"] if isinstance(v["zh"], str) else " ".join(v["zh"])
                       for table in (STEP_TEXT, NOTE_TEXT) for v in table.values() if "zh" in v)
    assert "种子文章" not in chinese and "原文 000" in chinese
    assert "层归一化" not in chinese and "层规范化" in chinese
