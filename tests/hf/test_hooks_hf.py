"""attnlab's hook names on Hugging Face models (attnlab.lens.hf_points): run_with_cache and
run_with_hooks on a transformers model running on attnlab's attention.

References: eager's ``output_attentions`` for the pattern (float32, weights in [0, 1]:
1e-6), ``output_hidden_states`` for the residual stream (the same tensors: exact before
the first hooked attention, 1e-6 after it, the plain steps' rounding against fused), and
an edited copy of the weights for an edit (zeroing every head's z = zeroing o_proj).
"""

from __future__ import annotations

import copy

import pytest
import torch

import attnlab.hf.attention as hf_attention
from attnlab.errors import AttnlabError
from attnlab.lens import hook_names, run_with_cache, run_with_hooks

from . import tiny_models as tm


@pytest.mark.parametrize("arch", ["llama", "bert", "gpt2", "gemma2", "gpt_oss"])
def test_pattern_of_one_layer_equals_eager_and_only_that_layer_builds_it(arch, monkeypatch):
    inputs = tm.batch("left")
    built = []
    explicit = hf_attention._explicit

    def spy(site, *args, **kwargs):
        built.append(site.prefix)
        return explicit(site, *args, **kwargs)

    monkeypatch.setattr(hf_attention, "_explicit", spy)
    model = tm.load(arch, "attnlab")
    with torch.no_grad():
        out, cache = run_with_cache(model, **inputs, names=["blocks.1.attn.hook_pattern"])
        ref = tm.load(arch, "eager")(**inputs, output_attentions=True, output_hidden_states=True)
    assert built == ["blocks.1.attn."]  # layer 0 stayed fused
    assert list(cache) == ["blocks.1.attn.hook_pattern"]
    real_rows = inputs["attention_mask"].bool()[:, None, :, None]
    diff = (cache["blocks.1.attn.hook_pattern"] - ref.attentions[1]).abs()
    assert diff.masked_fill(~real_rows, 0.0).max().item() < 1e-6
    plain = model(**inputs)
    field = "last_hidden_state" if arch == "bert" else "logits"
    torch.testing.assert_close(getattr(out, field), getattr(plain, field), atol=2e-6, rtol=0)


def test_residual_points_are_the_hidden_states_and_z_is_pattern_times_v():
    inputs = tm.batch("right")
    model = tm.load("llama", "attnlab")
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.0.attn.hook_v",
             "blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z", "blocks.0.hook_resid_mid",
             "blocks.0.attn.hook_attn_scores"]
    with torch.no_grad():
        _, cache = run_with_cache(model, **inputs, names=names)
        states = model(**inputs, output_hidden_states=True).hidden_states
    assert torch.equal(cache["blocks.0.hook_resid_pre"], states[0])
    # layer 0's pattern is asked for, so it ran the plain steps, the plain run fused:
    # float32 rounding apart
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], states[1], atol=1e-6, rtol=0)
    v = cache["blocks.0.attn.hook_v"].repeat_interleave(2, dim=1)  # GQA: 2 query heads each
    torch.testing.assert_close(cache["blocks.0.attn.hook_z"],
                               cache["blocks.0.attn.hook_pattern"] @ v, atol=1e-6, rtol=0)
    scores = cache["blocks.0.attn.hook_attn_scores"]
    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)  # (T, S)
    assert torch.isneginf(scores[0, 0][future]).all()  # causal: the future is -inf
    assert torch.isfinite(scores[0, 0][~future]).all()
    assert cache["blocks.0.hook_resid_mid"].shape == states[0].shape
    assert hook_names(model)[:3] == ["blocks.0.hook_resid_pre", "blocks.0.attn.hook_q",
                                     "blocks.0.attn.hook_k"]


def test_zeroing_every_head_in_hook_z_equals_zeroing_o_proj():
    inputs = tm.batch("right")
    model = tm.load("llama", "attnlab")
    edited = copy.deepcopy(model)
    with torch.no_grad():
        edited.model.layers[0].self_attn.o_proj.weight.zero_()
        got = run_with_hooks(model, **inputs,
                             hooks=[("blocks.0.attn.hook_z", lambda z, name: torch.zeros_like(z))])
        want = edited(**inputs)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-6, rtol=0)


def test_output_attentions_with_hooks_returns_the_hooked_pattern():
    inputs = tm.batch("left")
    model = tm.load("gpt_oss", "attnlab")
    with torch.no_grad():
        out, cache = run_with_cache(model, **inputs, output_attentions=True,
                                    names=["blocks.0.attn.hook_pattern"])
    assert torch.equal(out.attentions[0], cache["blocks.0.attn.hook_pattern"])
    assert out.attentions[1] is not None  # the other layer's weights from the plain path


def test_attention_points_need_attnlabs_implementation_and_resid_mid_is_read_only():
    inputs = tm.batch("right")
    with pytest.raises(AttnlabError, match=r"attn_implementation='sdpa'"):
        run_with_cache(tm.load("llama", "sdpa"), **inputs,
                       names=["blocks.0.attn.hook_pattern"])
    with torch.no_grad():  # residual points work on any implementation
        _, cache = run_with_cache(tm.load("llama", "sdpa"), **inputs,
                                  names=["blocks.1.hook_resid_pre"])
    assert "blocks.1.hook_resid_pre" in cache
    with pytest.raises(AttnlabError, match=r"hook_resid_mid: read-only"):
        run_with_hooks(tm.load("llama", "attnlab"), **inputs,
                       hooks=[("blocks.0.hook_resid_mid", lambda x, name: x * 0)])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_deep_copy_of_a_hooked_model_has_its_own_points(arch):
    """copy.deepcopy after the points are installed: the copy's points sit on the copy's
    modules (they were closures over the original's, so the copy's hooks read and edited
    the original, and its attention points never fired)."""
    model = tm.load(arch, "attnlab")
    inputs = tm.batch()
    names = ["blocks.0.attn.hook_z", "blocks.0.hook_resid_mid", "blocks.1.hook_resid_post"]
    with torch.no_grad():
        _, original = run_with_cache(model, **inputs, names=names)  # installs the points
        twin = copy.deepcopy(model)
        for parameter in twin.parameters():  # a different model from here on
            parameter.mul_(0.5)
        _, copied = run_with_cache(twin, **inputs, names=names)
        _, again = run_with_cache(model, **inputs, names=names)
        zeroed = run_with_hooks(twin, **inputs, hooks=[
            ("blocks.0.attn.hook_z", lambda z, name: torch.zeros_like(z))])
        plain = model(**inputs)
    assert sorted(copied) == sorted(names)  # every point of the copy fired
    for name in names:
        assert (copied[name] - original[name]).abs().max() > 1e-4  # the copy's own values
        assert torch.equal(again[name], original[name])  # the original is untouched
    assert (zeroed.logits - plain.logits).abs().max() > 1e-4
    assert torch.equal(model(**inputs).logits, plain.logits)
