"""What a learner found wrong in the lab's labels, each fixed and held here.

The expected strings are written out by hand: they are what the lesson teaches
(Wv is E × d_v; pre-LN's residual is x + attention(LayerNorm(x))).
"""

from __future__ import annotations

import numpy as np
import pytest

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


def test_the_causal_example_does_not_tell_the_story_its_mask_forbids():
    from attnlab.report import note_lines
    causal = attnlab.explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True)
    zh, en = note_lines(causal, "zh")[0], note_lines(causal, "en")[0]
    assert "看不到" in zh and "不加掩码" in zh
    assert "out of its reach" in en and "is what trained weights learn" not in en
    free = attnlab.explain(tokens=["小明", "去了", "学校"], num_heads=2)
    assert "is what trained weights learn" in note_lines(free, "en")[0]


def test_a_fully_masked_row_note_says_seed_000s_additive_mask_is_silently_ignored():
    from attnlab.report import note_lines
    left = attnlab.explain(tokens=["[PAD]", "a", "b"], key_padding=np.array([False, True, True]),
                           is_causal=True)
    en = " ".join(note_lines(left, "en"))
    zh = " ".join(note_lines(left, "zh"))
    assert "ignores the mask" in en and "等于完全没有掩码" in zh
    # the claim itself, checked by hand: additive -1e9 on a fully blocked row, then a
    # max-subtracted softmax, gives the unmasked softmax
    s = np.array([0.3, -1.2, 2.0])
    blocked = s + np.ones(3) * -1e9
    e = np.exp(blocked - blocked.max())
    unmasked = np.exp(s - s.max())
    np.testing.assert_allclose(e / e.sum(), unmasked / unmasked.sum(), rtol=1e-6)


def test_a_previous_token_head_is_not_called_over_sparse_in_the_table():
    from attnlab.lens.diagnostics import diagnose
    from attnlab.report import diagnostics_table
    previous = np.eye(6, k=-1)
    previous[0, 0] = 1.0  # the first token has only itself
    for lang, said, wrong in (("en", "one-hot by position", "over-sparse,"),
                              ("zh", "按位置的 one-hot", "过度稀疏、")):
        table = diagnostics_table(diagnose(previous[None]), lang)
        assert said in table and wrong not in table.splitlines()[2]
    # a one-hot head on no fixed position keeps the plain flag
    scattered = np.eye(6)[[3, 0, 5, 1, 2, 4]]
    assert "over-sparse" in diagnostics_table(diagnose(scattered[None]), "en").splitlines()[2]


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_minilm_examples_use_chinese_the_model_knows():
    from attnlab.models import load_minilm
    tokens = load_minilm().tokenize(["小明去了学校", "天上有月，水中也有月。"])[2]
    assert "[UNK]" in tokens[0]  # 去, 了 and 校 are not in MiniLM's vocabulary
    assert "[UNK]" not in tokens[1]
    # The README is a landing page now; MiniLM's examples live on the site's pages.
    pages = [ROOT / "README.md", ROOT / "README.zh.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert not [p.name for p in pages if '"小明去了学校"' in p.read_text(encoding="utf-8")]
    for name in ("models.md", "models.zh.md"):
        assert '"天上有月，水中也有月。"' in (ROOT / "docs" / name).read_text(encoding="utf-8")
    lesson = (ROOT / "scripts" / "make_tutorial.py").read_text(encoding="utf-8")
    assert "[UNK]" in lesson  # the lesson says why 小明 去了 学校 stays off MiniLM


def test_the_seed_claims_table_calls_the_scaling_claim_right_and_names_saturation():
    # The table moved from the README to the site's page on the seed articles.
    seeds = (ROOT / "docs" / "seeds.md").read_text(encoding="utf-8")
    row = next(line for line in seeds.splitlines() if "prevents vanishing gradients" in line)
    assert row.split("|")[2].strip().startswith("right") and "saturation" in row
    mask_row = next(line for line in seeds.splitlines() if "`scores + mask * -1e9`" in line)
    assert "silently ignores the mask" in mask_row
    zh = (ROOT / "docs" / "seeds.zh.md").read_text(encoding="utf-8")
    assert "说得对" in zh and "饱和" in zh
    assert not [p.name for p in (ROOT / "docs").glob("*.zh.md")
                if "种子文章" in p.read_text(encoding="utf-8")]
    assert "种子文章" not in (ROOT / "README.zh.md").read_text(encoding="utf-8")


def test_the_animal_sentence_is_attributed_to_its_source():
    lesson = (ROOT / "scripts" / "make_tutorial.py").read_text(encoding="utf-8")
    assert "Google's 2017 Transformer blog post" in lesson and "Illustrated Transformer" in lesson
    from attnlab.cli.help_zh import HELP_ZH
    assert "seed 001 的例句" not in HELP_ZH[("inspect", "text")]
    assert "Google 2017" in HELP_ZH[("inspect", "text")]
    from attnlab.lens import find
    assert "Google's 2017 Transformer blog post" in (find.__doc__ or "")


def test_the_it_animal_heads_link_the_subject_noun_not_the_referent():
    """README and lesson 11: with "too wide" ("it" is the street) the heads found for
    it -> animal still look at "animal" more than at "street"."""
    from attnlab.models import load_minilm
    model = load_minilm()
    text = "The animal didn't cross the street because it was too wide."
    trace = model.run(text, keep=("weights",))
    w, tokens = trace.attention(), trace.tokens  # (L, H, T, T)
    it, animal, street = (tokens.index(t) for t in ("it", "animal", "street"))
    for layer, head in ((5, 11), (3, 1)):  # layer 6 head 12, layer 4 head 2, from 0
        assert w[layer, head, it, animal] > 2 * w[layer, head, it, street]
    assert round(float(w[5, 11, it, animal]), 2) == 0.56  # the figure the README quotes


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_draw_positions_titles_neither_overlap_nor_leave_the_figure(lang):
    from attnlab.report import draw
    fig = draw("positions", lang=lang)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    boxes = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    assert len(boxes) == 4
    for box in boxes:  # inside the figure (the last one was clipped)
        assert box.x0 >= page.x0 - 0.5 and box.x1 <= page.x1 + 0.5
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)


def test_pre_ln_explains_the_row_layer_norm_sends_to_zero():
    from attnlab.report import note_lines
    pre = attnlab.explain(norm="pre", Wo=True)  # seed 000's X: row 3 is [1, 1, 1, 1]
    assert np.array_equal(pre.get("normed_in").values[2], np.zeros(4))
    en, zh = " ".join(note_lines(pre, "en")), " ".join(note_lines(pre, "zh"))
    assert "Rows 3 (word3) have all features equal" in en and "LayerNorm maps them to 0" in en
    assert "第 3 行" in zh and "层规范化把它们变成 0" in zh
    post = attnlab.explain(norm="post", Wo=True)
    assert "all features equal" not in " ".join(note_lines(post, "en"))
