"""attnlab.lens.hf_lens on Hugging Face models running attnlab's attention (random Llama
with grouped heads, GPT-2). References: weight surgery on a copy of the model (zeroed
o_proj / c_proj columns or rows), the model's own logits, finite differences of a gate.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from tests.support.hf_folders import gpt2_folder, llama_folder

import attnlab.hf
from attnlab.errors import AttnlabError
from attnlab.lens.hf_lens import (
    ablate_heads,
    head_importance,
    logit_lens,
    repeated_tokens_scores,
)

IDS = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102]])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("lens")
    attnlab.hf.register()
    found = {}
    for kind, build in (("llama", llama_folder), ("gpt2", gpt2_folder)):
        folder: Path = build(root / kind)
        found[kind] = transformers.AutoModelForCausalLM.from_pretrained(
            folder, attn_implementation="attnlab").eval()
    return found


def _surgery(model, layer: int, head: int):
    """A copy of the model whose W_O ignores one head: its D columns (Linear, y = W x)
    or rows (GPT-2's Conv1D, y = x W) set to 0."""
    edited = copy.deepcopy(model)
    D = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        if hasattr(edited, "model"):
            edited.model.layers[layer].self_attn.o_proj.weight[:, head * D:(head + 1) * D] = 0
        else:
            edited.transformer.h[layer].attn.c_proj.weight[head * D:(head + 1) * D] = 0
    return edited


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_zero_ablation_equals_weight_surgery(models, kind) -> None:
    model = models[kind]
    with torch.no_grad():
        ablated = ablate_heads(model, [(1, 2), (0, 1)], input_ids=IDS).logits
        edited = _surgery(_surgery(model, 1, 2), 0, 1)(input_ids=IDS).logits
        plain = model(input_ids=IDS).logits
    # float32, the same operations on zeros instead of zeroed weights: 1e-5
    np.testing.assert_allclose(ablated.numpy(), edited.numpy(), atol=1e-5)
    assert (ablated - plain).abs().max() > 1e-3  # the ablation did change something


def test_mean_ablation_replaces_z_by_its_mean(models) -> None:
    from attnlab.lens import run_with_cache

    model = models["llama"]
    with torch.no_grad():
        _, cache = run_with_cache(model, input_ids=IDS, names=["blocks.0.attn.hook_z"])
        mean = cache["blocks.0.attn.hook_z"][0, 3].mean(dim=0)  # (D,)
        out = ablate_heads(model, [(0, 3)], how="mean", input_ids=IDS).logits
        # by hand: W_O applied to (mean − z) for that head, added to the attention output
        attention = model.model.layers[0].self_attn
        D = attention.head_dim
        shift = (mean - cache["blocks.0.attn.hook_z"][0, 3]) @ attention.o_proj.weight[
            :, 3 * D:4 * D].T  # (T, E)
        # equivalently: a forward hook adding `shift` to the layer's attention output
        handle = attention.register_forward_hook(
            lambda module, args, output: (output[0] + shift[None],) + tuple(output[1:]))
        try:
            expected = model(input_ids=IDS).logits
        finally:
            handle.remove()
    np.testing.assert_allclose(out.numpy(), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_logit_lens_at_the_last_layer_is_the_models_logits(models, kind) -> None:
    lens, logits = logit_lens(models[kind], input_ids=IDS)
    assert lens.shape == (2, IDS.shape[1], models[kind].config.vocab_size)
    np.testing.assert_allclose(lens[-1], logits, atol=1e-5)  # the same float32 modules
    assert np.abs(lens[0] - logits).max() > 1e-3  # an earlier layer is not the answer


def test_head_importance_is_the_gates_derivative(models) -> None:
    model = models["llama"]
    target = 2003

    def metric(output):
        return torch.log_softmax(output.logits[0, -1], dim=-1)[target]

    scores = head_importance(model, metric, input_ids=IDS)
    assert scores.shape == (2, 4)
    # Central difference on one gate, scaling the head's o_proj columns by 1 ± eps.
    eps = 1e-2
    layer, head = 1, 2
    D = model.config.hidden_size // 4
    values = []
    for sign in (1, -1):
        edited = copy.deepcopy(model)
        with torch.no_grad():
            edited.model.layers[layer].self_attn.o_proj.weight[:, head * D:(head + 1) * D] *= (
                1 + sign * eps)
            values.append(float(metric(edited(input_ids=IDS))))
    # float32 forward (rounding ~1e-6 over eps = 1e-2) and the O(eps²) error: 1e-2 relative
    assert scores[layer, head] == pytest.approx(abs(values[0] - values[1]) / (2 * eps),
                                                rel=1e-2, abs=1e-4)


def test_detectors_on_repeated_random_tokens(models) -> None:
    scores = repeated_tokens_scores(models["gpt2"], length=12)
    assert set(scores) == {"previous_token", "duplicate_token", "induction"}
    assert all(s.shape == (2, 4) and np.isfinite(s).all() for s in scores.values())


def test_bad_heads_are_named(models) -> None:
    with pytest.raises(AttnlabError, match=r"heads: expected \(layer, head\) pairs"):
        ablate_heads(models["llama"], [(2, 0)], input_ids=IDS)
    with pytest.raises(AttnlabError, match="how: expected 'zero' or 'mean'"):
        ablate_heads(models["llama"], [(0, 0)], how="half", input_ids=IDS)
