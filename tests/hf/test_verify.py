"""attnlab.hf.verify and ``attnlab verify``: the float64 plain path as the reference, eager's
error as the rounding budget (FlashAttention's 2× rule), and a verdict that tells a
correct implementation (rounding) from a broken one (a bug), on small random models.

The broken implementations are registered here: one that drops the mask (what
registering an attention function without a mask function does), one with a scale
off by 0.1 % (a bug far smaller than the first, and still far beyond rounding).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from attnlab.cli.app import main
from attnlab.hf import verify
from attnlab.hf.attention import attention_function

from . import tiny_models as tm


def _broken(name, change):
    fused = attention_function("torch")

    def attention(module, query, key, value, attention_mask, **kwargs):
        mask, changed = change(attention_mask, kwargs)
        return fused(module, query, key, value, mask, **changed)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def _mask_dropped(mask, kwargs):
    return None, kwargs


def _scale_off(mask, kwargs):
    return mask, {**kwargs, "scaling": kwargs["scaling"] * 1.001}


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_correct_implementations_are_within_rounding(arch):
    model = tm.load(arch, "eager")
    report = verify(model, tm.batch("left"))
    assert report.verdict == {"sdpa": "rounding", "attnlab": "rounding"}
    assert report.first_disagreement == {"sdpa": None, "attnlab": None}
    assert report.padded and report.baseline == "eager"
    for layer in report.layers[1:]:
        assert 0 < layer.hidden["eager"] < 1e-5  # float32 rounding, and not zero
        assert len(layer.pattern["eager"]) == model.config.num_attention_heads
        assert max(layer.pattern["attnlab"]) < 1e-6
    json.dumps(report.to_json())


@pytest.mark.parametrize("change, name", [(_mask_dropped, "dropped"), (_scale_off, "scale")])
def test_a_broken_implementation_is_a_bug_from_its_first_layer(change, name):
    broken = _broken(f"broken_{name}", change)
    report = verify(tm.load("llama", "eager"), tm.batch("left"), candidates=("attnlab", broken))
    assert report.verdict == {"attnlab": "rounding", broken: "bug"}
    assert report.first_disagreement[broken] == 1


def test_eager_that_is_not_finite_is_no_baseline():
    """float64 and left padding: Llama's eager upcasts softmax to float32, padded rows give
    NaN; sdpa is the baseline then."""
    report = verify(tm.load("llama", "eager", torch.float64), tm.batch("left"))
    assert "eager_not_finite" in report.notes and report.baseline == "sdpa"
    assert report.verdict["attnlab"] == "rounding"
    assert report.to_json()["layers"][2]["hidden"]["eager"] is None  # NaN -> None in JSON


def test_cli_verify_json_and_chinese(capsys):
    folder = str(tm.saved("gpt_oss"))
    assert main(["verify", folder, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == {"sdpa": "unavailable", "attnlab": "rounding"}
    assert "sdpa_unavailable" in report["notes"]  # GPT-OSS has no sdpa
    assert main(["verify", str(tm.saved("llama")), "--lang", "zh"]) == 0
    text = capsys.readouterr().out
    assert "结论" in text and "舍入误差" in text and "第一个超出预算的层" in text


def test_cli_verify_refuses_a_folder_without_a_model(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 2
    assert "MODEL_DIR: expected a model folder with config.json" in capsys.readouterr().err
    assert main(["verify", str(tmp_path), "--lang", "zh"]) == 2
    assert "需要一个含 config.json 的模型文件夹" in capsys.readouterr().err
