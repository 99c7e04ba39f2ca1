"""attnlab lens --model on a Hugging Face decoder folder (random Llama with grouped heads,
MiniLM's tokenizer): the printed and written numbers are the model's own, checked against
weight surgery and the model's logits."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import transformers
from tests.support.hf_folders import llama_folder

import attnlab.hf
from attnlab.cli.app import main

TEXT = "The cat sat on the mat because it was warm."


def test_lens_model_on_a_decoder(capsys, tmp_path) -> None:
    folder = llama_folder(tmp_path / "llama")
    code = main(["lens", "--model", str(folder), TEXT, "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "lens.json").read_text(encoding="utf-8"))
    assert report["numbered_from"] == 1 and np.shape(report["ablation_drop"]) == (2, 4)
    assert "head importance" in out and "logit lens" in out and "induction" in out
    # The drop for layer 2 head 3 is the one weight surgery gives (eager model, o_proj's
    # columns of that head zeroed): float32 log-probabilities, 1e-5.
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()

    def measure(m) -> float:
        with torch.no_grad():
            logprobs = torch.log_softmax(m(input_ids=ids).logits[0, :-1], dim=-1)
        return float(logprobs.gather(1, ids[0, 1:, None]).mean())

    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.model.layers[1].self_attn.o_proj.weight[:, 2 * 8:3 * 8] = 0
    assert report["mean_next_token_logprob"] == pytest.approx(measure(model), abs=1e-5)
    assert report["ablation_drop"][1][2] == pytest.approx(measure(model) - measure(edited),
                                                          abs=1e-5)
    # The logit lens's last layer is the model's own prediction at the last position.
    with torch.no_grad():
        last = int(model(input_ids=ids).logits[0, -1].argmax())
    assert report["logit_lens_top"][-1] == tokenizer.convert_ids_to_tokens(last)


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "someone/not-here", "a cat"], "--model: cannot load 'someone/not-here'"),
])
def test_lens_model_errors_are_one_line(capsys, tmp_path, args, message) -> None:
    code = main(["lens", *args, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1, err


CLEAN = "The cat sat on the mat"
CORRUPTED = "The dog sat on the mat"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> object:
    return llama_folder(tmp_path_factory.mktemp("llama"))


def _lens(capsys, out, folder, *args):
    code = main(["lens", "--model", str(folder), CLEAN, "--out", str(out), *args])
    printed, err = capsys.readouterr()
    assert code == 0, err
    return json.loads((out / "lens.json").read_text(encoding="utf-8")), printed


def _answer_logprob(folder, text, hook=None) -> tuple[float, int]:
    """log p(answer) at the last position, answer = the clean text's top next token, on
    the eager model (transformers' own attention), with an optional pre-hook on layer
    ``hook[0]``'s o_proj."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        answer = int(model(**tokenizer(CLEAN, return_tensors="pt")).logits[0, -1].argmax())
        handle = (model.model.layers[hook[0]].self_attn.o_proj.register_forward_pre_hook(hook[1])
                  if hook else None)
        try:
            logits = model(**tokenizer(text, return_tensors="pt")).logits[0, -1]
        finally:
            if handle is not None:
                handle.remove()
    return float(torch.log_softmax(logits, dim=-1)[answer]), answer


def test_lens_model_patch_and_patch_sweep(capsys, tmp_path, llama) -> None:
    """The patched log-probability of layer 2 head 3 is the one torch's own hooks on the
    eager model's o_proj give (its 8 columns of z copied from the clean run)."""
    seen = {}
    _answer_logprob(llama, CLEAN, (1, lambda m, a: seen.update(z=a[0].clone())))

    def write(module, args):
        z = args[0].clone()
        z[..., 2 * 8:3 * 8] = seen["z"][..., 2 * 8:3 * 8]
        return (z,)

    expected, _ = _answer_logprob(llama, CORRUPTED, (1, write))
    clean, _ = _answer_logprob(llama, CLEAN)
    dirty, _ = _answer_logprob(llama, CORRUPTED)
    report, printed = _lens(capsys, tmp_path / "sweep", llama, "--corrupted", CORRUPTED,
                            "--analysis", "patch-sweep")
    assert report["analysis"] == "patch-sweep" and np.shape(report["patched_logprob"]) == (2, 4)
    # eager vs attnlab's attention in float32 over width 32: 1e-5
    assert report["clean_logprob"] == pytest.approx(clean, abs=1e-5)
    assert report["corrupted_logprob"] == pytest.approx(dirty, abs=1e-5)
    assert report["patched_logprob"][1][2] == pytest.approx(expected, abs=1e-5)
    assert "patched - corrupted" in printed
    one, printed = _lens(capsys, tmp_path / "one", llama, "--corrupted", CORRUPTED,
                         "--analysis", "patch", "--heads", "2.3")
    assert one["heads"] == [[2, 3]] and one["patched_logprob"] == pytest.approx(expected,
                                                                               abs=1e-5)
    assert one["restored"] == pytest.approx((expected - dirty) / (clean - dirty), abs=1e-3)
    assert "of the gap restored" in printed


def test_lens_model_path_patch_and_attribution(capsys, tmp_path, llama) -> None:
    from attnlab.lens.hf_lens import direct_logit_attribution, path_patch

    report, _ = _lens(capsys, tmp_path / "path", llama, "--corrupted", CORRUPTED,
                      "--analysis", "path-patch", "--sender", "1.2", "--receivers", "2.1,2.4")
    assert report["sender"] == [1, 2] and report["receivers"] == [[2, 1], [2, 4]]
    attnlab.hf.register()
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        llama, attn_implementation="attnlab").eval()
    ids = {text: tokenizer(text, return_tensors="pt")["input_ids"] for text in (CLEAN, CORRUPTED)}
    with torch.no_grad():
        logits = path_patch(model, {"input_ids": ids[CLEAN]}, {"input_ids": ids[CORRUPTED]},
                            sender=(0, 1), receivers=[(1, 0), (1, 3)]).logits[0, -1]
    expected = float(torch.log_softmax(logits, dim=-1)[report["answer_id"]])
    # the same model and operations, numbered from 1 on the command line: 1e-6
    assert report["patched_logprob"] == pytest.approx(expected, abs=1e-6)
    dla, printed = _lens(capsys, tmp_path / "dla", llama, "--analysis", "dla")
    scores, token = direct_logit_attribution(model, input_ids=ids[CLEAN])
    assert dla["token_id"] == token
    np.testing.assert_allclose(dla["direct_logit_attribution"], scores, atol=1e-6)
    assert "direct contribution" in printed


@pytest.mark.parametrize(("args", "message"), [
    (["--analysis", "patch", "--heads", "1.1"],
     "--analysis patch: expected --corrupted OTHER"),
    (["--corrupted", CORRUPTED, "--analysis", "patch"],
     "--heads: expected with --analysis patch"),
    (["--heads", "1.1"],
     "--heads: only used with --analysis patch, got --analysis overview"),
    (["--corrupted", CORRUPTED, "--analysis", "dla"],
     "--corrupted: only used with --analysis patch | patch-sweep | path-patch"),
    (["--corrupted", CORRUPTED, "--analysis", "patch", "--heads", "3.1"],
     "--heads: expected heads as LAYER.HEAD with layers 1..2 and heads 1..4"),
    (["--corrupted", CORRUPTED, "--analysis", "patch", "--heads", "1.x"],
     "--heads: expected heads as LAYER.HEAD"),
    (["--corrupted", CORRUPTED, "--analysis", "path-patch", "--sender", "2.1",
      "--receivers", "1.1"],
     "--receivers: expected heads in layers after the sender's (layer 2), got 1.1"),
    (["--corrupted", "A dog was lying on the mat today", "--analysis", "patch-sweep"],
     "--corrupted: expected as many tokens as TEXT (8)"),
])
def test_lens_model_analysis_errors_are_one_line(capsys, tmp_path, llama, args,
                                                 message) -> None:
    code = main(["lens", "--model", str(llama), CLEAN, "--out", str(tmp_path), *args])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_lens_analysis_errors_in_chinese(capsys, tmp_path, llama) -> None:
    code = main(["lens", "--model", str(llama), CLEAN, "--out", str(tmp_path), "--lang", "zh",
                 "--analysis", "path-patch", "--corrupted", CORRUPTED, "--sender", "1.2"])
    _, err = capsys.readouterr()
    assert code == 2 and "--receivers：--analysis path-patch 需要它" in err, err
    # the options of the Hugging Face lens are refused on attnlab's own BERT lens
    code = main(["lens", "a cat", "--analysis", "dla", "--out", str(tmp_path), "--lang", "zh"])
    _, err = capsys.readouterr()
    assert code == 2 and "--analysis：只用于 --model" in err, err


def test_attribution_refuses_a_norm_it_cannot_freeze_in_both_languages(capsys, tmp_path) -> None:
    """Gemma 2's final RMSNorm multiplies by (1 + weight): the attribution says it cannot
    freeze it, in the language of --lang."""
    from tests.hf.tiny_models import saved

    folder = saved("gemma2")
    capsys.readouterr()  # saving the folder may draw a progress bar
    for lang, text in (("en", "model: the final norm Gemma2RMSNorm is neither"),
                       ("zh", "model：最终归一化层 Gemma2RMSNorm 既不是")):
        code = main(["lens", "--model", str(folder), CLEAN, "--analysis", "dla", "--lang", lang,
                     "--out", str(tmp_path)])
        _, err = capsys.readouterr()
        assert code == 2 and text in err and err.count("\n") == 1, err
