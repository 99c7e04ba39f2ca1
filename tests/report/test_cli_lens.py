"""attnlab lens: files written, numbers equal the lenses' own, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab import lens
from attnlab.cli.app import main
from attnlab.models import load_minilm


def test_lens_with_a_pair_writes_every_output(capsys, tmp_path):
    text, other = "The baby is sleeping.", "The infant is asleep."
    code = main(["lens", text, "--pair", other, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    for name in ("importance.png", "ablation.png", "rollout.png", "lens.json"):
        assert (tmp_path / name).stat().st_size > 0 and name in err
    data = json.loads((tmp_path / "lens.json").read_text(encoding="utf-8"))
    model = load_minilm()
    full = model.encode([text, other])
    with lens.ablate(model, heads=[(2, 3)]):
        ablated = model.encode([text, other])
    # The same computation as the command's: equal up to float32 summation order.
    assert data["drift"][2][3] == pytest.approx(float(1 - ablated[0] @ full[0]), abs=1e-6)
    assert data["similarity_change"][2][3] == pytest.approx(
        float(ablated[0] @ ablated[1] - full[0] @ full[1]), abs=1e-6)
    assert data["similarity"] == pytest.approx(float(full[0] @ full[1]), abs=1e-6)
    weights, tokens = model.attentions(text)
    assert data["tokens"] == tokens
    np.testing.assert_allclose(data["rollout"], lens.attention_rollout(weights), atol=1e-12)
    assert np.array(data["flow"]).shape == (len(tokens), len(tokens))
    assert np.array(data["importance"]).shape == (6, 12) and data["importance_over"] == "the pair"
    assert "whole layer zeroed" in out and "cos(TEXT, OTHER)" in out


def test_lens_in_chinese(capsys, tmp_path):
    code = main(["lens", "春天的花美", "--pair", "春日花美", "--lang", "zh",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "整层置零" in out and "已写入" in err


@pytest.mark.parametrize("args,message", [
    (["lens"], "text: expected a TEXT, or --study"),
    (["lens", "hi", "--study"], "text: expected a TEXT, or --study"),
    (["lens", "--study", "--pair", "x"], "--pair: not with --study"),
    (["lens", "   "], "text: expected some text"),
])
def test_lens_errors_are_one_line(capsys, tmp_path, args, message):
    code = main([*args, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1


def test_lens_study_on_two_pairs(capsys, tmp_path, monkeypatch):
    # The whole study reads all 60 shipped pairs (a command, not a test); two keep it quick.
    from attnlab.studies import heads
    pairs = [("The baby is sleeping.", "The infant is asleep."), ("大道", "大街")]
    monkeypatch.setattr(heads, "sentence_pairs", lambda lang=None: pairs)
    code = main(["lens", "--study", "--lang", "zh", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads((tmp_path / "study.json").read_text(encoding="utf-8"))
    assert data["pairs"] == [list(p) for p in pairs]
    assert np.array(data["head_drift"]).shape == (6, 12)
    assert "2 对句子" in out and "按重要性排名前 5" in out and "Spearman" in out
    for name in ("ablation.png", "importance.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
