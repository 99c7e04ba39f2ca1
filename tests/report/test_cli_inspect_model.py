"""attnlab inspect --model for any Hugging Face folder: a decoder (random Llama with grouped
heads), GPT-2 and an encoder, each with MiniLM's tokenizer files.

The page's numbers are checked against transformers itself (a second copy of the model
on eager with ``output_attentions``, and ``generate``), not against attnlab's reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from tests.support.hf_folders import gpt2_folder, llama_folder

from attnlab.cli.app import main
from attnlab.report.viewer import decode_weights

TEXT = "The cat sat on the mat because it was warm."


def page_data(folder: Path) -> dict[str, Any]:
    html = (folder / "view.html").read_text(encoding="utf-8")
    match = re.search(r'id="attnlab-data">(.*?)</script>', html, re.S)
    assert match is not None
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"llama": llama_folder(root / "llama"), "gpt2": gpt2_folder(root / "gpt2")}


@pytest.fixture(scope="module")
def decoder_run(models, tmp_path_factory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("inspect-llama")
    code = main(["inspect", "--model", str(models["llama"]), TEXT, "--generate", "4",
                 "--find", "cat->sat", "--out", str(out)])
    assert code == 0
    return {"out": out, "data": page_data(out)}


def test_decoder_page_holds_eagers_weights_and_generates_tokens(models, decoder_run, capsys):
    data, out = decoder_run["data"], decoder_run["out"]
    for name in ("grid.png", "head.png", "view.html", "diagnostics.json"):
        assert (out / name).stat().st_size > 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["llama"])
    prompt = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(models["llama"]).eval()  # sdpa
    with torch.no_grad():
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                   max_new_tokens=4, do_sample=False, pad_token_id=0)[0]
    assert data["tokens"] == tokenizer.convert_ids_to_tokens(generated.tolist())
    assert data["prompt_length"] == prompt.shape[1]
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        models["llama"], attn_implementation="eager").eval()
    with torch.no_grad():
        reference = eager(input_ids=generated[None], output_attentions=True).attentions
    expected = np.stack([a[0].numpy() for a in reference]).astype(np.float64)  # (2, 4, T, T)
    T = expected.shape[-1]
    assert data["shape"] == [2, 4, T, T]
    # 16-bit codes of weight / row max (half a step: 7.63e-6) plus float32 rounding between
    # attnlab's hook_pattern and eager (3e-8 measured): within 7.7e-6 of eager's weights.
    np.testing.assert_allclose(decode_weights(data["weights"], data["shape"]), expected,
                               atol=7.7e-6)
    assert data["heads_per_kv"] == 2 and data["neuron"]["kv_heads"] == 2
    report = json.loads((out / "diagnostics.json").read_text(encoding="utf-8"))
    best = report["find"]["heads"][0]
    assert data["start"] == [best["layer"] - 1, best["head"] - 1]  # opens on --find's head


def test_gpt2_pair_and_an_encoder_pair(models, tmp_path, capsys):
    code = main(["inspect", "--model", str(models["gpt2"]), "The cat sat.", "--pair",
                 "It was warm.", "--out", str(tmp_path / "gpt2"), "--lang", "zh"])
    out, err = capsys.readouterr()
    assert code == 0, err
    data = page_data(tmp_path / "gpt2")
    split = data["tokens"].index("[SEP]") + 1
    assert data["segments"] == [0] * split + [1] * (len(data["tokens"]) - split)
    assert "allowed" in data and "注意力" in out + err
    code = main(["inspect", "The cat sat.", "--pair", "It was warm.",  # MiniLM, the default
                 "--out", str(tmp_path / "minilm")])
    _, err = capsys.readouterr()
    assert code == 0, err
    data = page_data(tmp_path / "minilm")
    assert data["shape"][:2] == [6, 12] and "allowed" not in data and "segments" in data


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "someone/not-here"], "--model: cannot load 'someone/not-here' from the "
     "Hugging Face hub (offline or unknown"),
    (["--pair", "x", "--generate", "2"], "--generate: expected either --generate or --pair"),
    (["--generate", "2"], "--generate: all-MiniLM-L6-v2 is an encoder"),
    (["--generate", "-1", "--model", "someone/x"], "--generate: expected a number of tokens"),
])
def test_errors_are_one_line(capsys, tmp_path, args, message):
    code = main(["inspect", "a cat", *args, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_ablation_effects_fill_the_pages_head_table(models, tmp_path, capsys):
    """--ablation: the page's head table holds ‖y_ablated − y‖ / ‖y‖ for each head zeroed,
    the change weight surgery on the eager model gives (o_proj's columns of the head)."""
    code = main(["inspect", "--model", str(models["llama"]), TEXT, "--ablation",
                 "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    table = np.array(page_data(tmp_path)["importance"])
    assert table.shape == (2, 4)
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["llama"])
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        models["llama"], attn_implementation="eager").eval()
    with torch.no_grad():
        plain = model(input_ids=ids).logits.double()
        model.model.layers[1].self_attn.o_proj.weight[:, 2 * 8:3 * 8] = 0
        edited = model(input_ids=ids).logits.double()
    # eager vs attnlab's attention in float32 (differences ~1e-7 of logits ~1): 1e-4 relative
    assert table[1, 2] == pytest.approx(float((edited - plain).norm() / plain.norm()), rel=1e-4)
    plain_page = tmp_path / "plain"
    assert main(["inspect", "--model", str(models["llama"]), TEXT, "--out",
                 str(plain_page)]) == 0
    assert "importance" not in page_data(plain_page)  # only when asked for
