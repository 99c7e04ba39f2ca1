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
