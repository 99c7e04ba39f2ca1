"""attnlab.lens.hf_lens on Hugging Face models running attnlab's attention (random Llama
with grouped heads, GPT-2). References: weight surgery on a copy of the model (zeroed
o_proj / c_proj columns or rows), the model's own logits, finite differences of a gate,
torch's own module hooks on o_proj / c_proj (patching), and the logit rebuilt by hand from
the embeddings, the MLPs' outputs and the heads (direct logit attribution).
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from tests.support.hf_folders import gpt2_folder, llama_folder

import attnlab.hf
from attnlab.errors import AttnlabError
from attnlab.lens.hf_lens import (
    ablate_heads,
    direct_logit_attribution,
    head_importance,
    logit_lens,
    patch,
    patch_sweep,
    repeated_tokens_scores,
)

IDS = torch.tensor([[101, 1996, 4937, 2938, 2006, 1996, 13523, 1012, 102]])
CORRUPTED = torch.tensor([[101, 1996, 3899, 2938, 2006, 1996, 13523, 1012, 102]])  # cat -> dog


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


def _projection(model, layer: int):
    return (model.model.layers[layer].self_attn.o_proj if hasattr(model, "model")
            else model.transformer.h[layer].attn.c_proj)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_patching_resid_post_everywhere_gives_the_clean_run(models, kind) -> None:
    model = models[kind]
    with torch.no_grad():
        clean = model(input_ids=IDS).logits
        dirty = model(input_ids=CORRUPTED).logits
        whole = patch(model, {"input_ids": IDS}, {"input_ids": CORRUPTED}, layers=[0]).logits
        last = patch(model, {"input_ids": IDS}, {"input_ids": CORRUPTED}, layers=[1],
                     positions=[-1]).logits
    assert (clean - dirty).abs().max() > 1e-3  # the corruption matters
    # Layer 1 reads only layer 0's output (same positions, same mask): the clean run's
    # logits, by the same float32 operations on the same tensors: 1e-6.
    np.testing.assert_allclose(whole.numpy(), clean.numpy(), atol=1e-6)
    # The last layer's output at the last position: that row is clean's, the others stay
    # the corrupted run's (the final norm and unembedding work position by position).
    np.testing.assert_allclose(last[0, -1].numpy(), clean[0, -1].numpy(), atol=1e-6)
    np.testing.assert_allclose(last[0, :-1].numpy(), dirty[0, :-1].numpy(), atol=1e-6)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_patching_a_heads_z_equals_editing_the_output_projections_input(models, kind) -> None:
    """Reference: torch's own forward pre-hooks on o_proj / c_proj, whose input is the
    heads' z side by side (B, T, H·D): read in the clean run, head 2's slice at positions
    2 and 3 written into the corrupted run."""
    model, layer, head = models[kind], 0, 2
    D = model.config.hidden_size // model.config.num_attention_heads
    seen = {}
    projection = _projection(model, layer)

    def read(module, args):
        seen["z"] = args[0].detach().clone()

    def write(module, args):
        x = args[0].clone()
        x[:, 2:4, head * D:(head + 1) * D] = seen["z"][:, 2:4, head * D:(head + 1) * D]
        return (x,)

    with torch.no_grad():
        handle = projection.register_forward_pre_hook(read)
        model(input_ids=IDS)
        handle.remove()
        handle = projection.register_forward_pre_hook(write)
        expected = model(input_ids=CORRUPTED).logits
        handle.remove()
        patched = patch(model, {"input_ids": IDS}, {"input_ids": CORRUPTED},
                        heads=[(layer, head)], positions=[2, 3]).logits
        dirty = model(input_ids=CORRUPTED).logits
    # the same float32 operations on the same values: 1e-6
    np.testing.assert_allclose(patched.numpy(), expected.numpy(), atol=1e-6)
    assert (patched - dirty).abs().max() > 1e-5  # the patch changed something


def _reference_patch(model, layer: int, head: int):
    """The corrupted run's logits with one head's z from the clean run at every position,
    by torch's own forward pre-hooks on o_proj / c_proj (input: the heads' z side by side)."""
    D = model.config.hidden_size // model.config.num_attention_heads
    columns = slice(head * D, (head + 1) * D)
    seen = {}
    projection = _projection(model, layer)

    def write(module, args):
        x = args[0].clone()
        x[..., columns] = seen["z"][..., columns]
        return (x,)

    with torch.no_grad():
        handle = projection.register_forward_pre_hook(
            lambda module, args: seen.update(z=args[0].detach().clone()))
        model(input_ids=IDS)
        handle.remove()
        handle = projection.register_forward_pre_hook(write)
        logits = model(input_ids=CORRUPTED).logits
        handle.remove()
    return logits


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_patch_sweep_entries_are_single_head_patches(models, kind) -> None:
    model = models[kind]

    def metric(output):  # logit difference of two answers at the last position
        return output.logits[0, -1, 2003] - output.logits[0, -1, 1996]

    sweep = patch_sweep(model, {"input_ids": IDS}, {"input_ids": CORRUPTED}, metric)
    assert sweep.shape == (2, 4)
    for layer, head in ((0, 1), (1, 3)):
        expected = float(metric(SimpleNamespace(logits=_reference_patch(model, layer, head))))
        # the same float32 operations on the same values: 1e-6
        assert sweep[layer, head] == pytest.approx(expected, abs=1e-6)
    assert np.ptp(sweep) > 1e-5  # the heads differ


def test_direct_logit_attribution_rebuilds_the_logit_llama(models) -> None:
    """The logit = (embedding + each MLP's output + each head's output) · frozen norm ·
    W_U[token]: the heads' part from attribution, the rest and the logit read with
    torch's own hooks (Llama: no biases anywhere)."""
    model = models["llama"]
    seen: dict[str, torch.Tensor] = {}
    handles = [model.model.embed_tokens.register_forward_hook(
        lambda m, a, out: seen.update(embed=out[0]))]
    for index, layer in enumerate(model.model.layers):
        handles.append(layer.mlp.register_forward_hook(
            lambda m, a, out, i=index: seen.update({f"mlp{i}": out[0]})))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, a, i=index: seen.update({f"z{i}": a[0][0]})))
    handles.append(model.model.norm.register_forward_pre_hook(
        lambda m, a: seen.update(final=a[0][0])))
    with torch.no_grad():
        logits = model(input_ids=IDS).logits[0, -1]
    for handle in handles:
        handle.remove()
    scores, token = direct_logit_attribution(model, input_ids=IDS)
    assert scores.shape == (2, 4) and token == int(logits.argmax())
    norm, W_U = model.model.norm, model.lm_head.weight.detach()
    with torch.no_grad():
        x = seen["final"][-1]
        direction = norm.weight * torch.rsqrt(x.pow(2).mean() + norm.variance_epsilon) * W_U[token]
        D = 8
        hand = np.empty((2, 4))
        for layer in range(2):
            w_o = model.model.layers[layer].self_attn.o_proj.weight
            for head in range(4):
                r = w_o[:, head * D:(head + 1) * D] @ seen[f"z{layer}"][-1, head * D:(head + 1) * D]
                hand[layer, head] = float(r @ direction)
        rest = seen["embed"][-1] + seen["mlp0"][-1] + seen["mlp1"][-1]
        rebuilt = float(rest @ direction) + scores.sum()
    # float32 products of width 32 (|terms| < 1): 1e-5
    np.testing.assert_allclose(scores, hand, atol=1e-5)
    assert rebuilt == pytest.approx(float(logits[token]), abs=1e-5)
    other, _ = direct_logit_attribution(model, token=2003, position=3, input_ids=IDS)
    assert np.abs(other - scores).max() > 1e-4


def test_direct_logit_attribution_rebuilds_the_logit_gpt2(models) -> None:
    """GPT-2: LayerNorm (centring, frozen scale, bias) and Conv1D projections with
    biases; every other term read with torch's own hooks."""
    model = models["gpt2"]
    body = model.transformer
    seen: dict[str, torch.Tensor] = {}
    handles = [body.drop.register_forward_hook(lambda m, a, out: seen.update(embed=out[0]))]
    for index, block in enumerate(body.h):
        handles.append(block.mlp.register_forward_hook(
            lambda m, a, out, i=index: seen.update({f"mlp{i}": out[0]})))
    handles.append(body.ln_f.register_forward_pre_hook(
        lambda m, a: seen.update(final=a[0][0])))
    with torch.no_grad():
        logits = model(input_ids=IDS).logits[0, -1]
    for handle in handles:
        handle.remove()
    scores, token = direct_logit_attribution(model, token=1996, input_ids=IDS)
    ln, W_U = body.ln_f, model.lm_head.weight.detach()
    with torch.no_grad():
        x = seen["final"][-1]
        scale = torch.rsqrt((x - x.mean()).pow(2).mean() + ln.eps)
        rest = seen["embed"][-1] + seen["mlp0"][-1] + seen["mlp1"][-1] + sum(
            block.attn.c_proj.bias for block in body.h)
        rebuilt = float(((rest - rest.mean()) * scale * ln.weight + ln.bias) @ W_U[token])
    # float32 sums over width 32 and the head terms: 1e-5
    assert rebuilt + scores.sum() == pytest.approx(float(logits[token]), abs=1e-5)


def test_bad_patch_requests_are_named(models) -> None:
    model, clean, dirty = models["llama"], {"input_ids": IDS}, {"input_ids": CORRUPTED}
    with pytest.raises(AttnlabError, match="heads, layers: expected exactly one"):
        patch(model, clean, dirty)
    with pytest.raises(AttnlabError, match=r"layers: expected layers in \[0, 2\)"):
        patch(model, clean, dirty, layers=[2])
    with pytest.raises(AttnlabError, match=r"positions: expected positions in \[-9, 9\)"):
        patch(model, clean, dirty, layers=[0], positions=[9])
    with pytest.raises(AttnlabError, match="corrupted: expected inputs of the clean run's"):
        patch(model, clean, {"input_ids": IDS[:, :5]}, layers=[0])
    with pytest.raises(AttnlabError, match="token: expected a token id"):
        direct_logit_attribution(model, token=-1, input_ids=IDS)


def _three_layer_llama():
    """A random Llama with three layers (so a layer between sender and receiver is frozen),
    4 query heads on 2 key/value heads, on attnlab's attention."""
    torch.manual_seed(1)
    config = transformers.LlamaConfig(vocab_size=30522, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("attnlab")
    return model


def _reference_path_patch(model, sender, receivers, positions):
    """The two runs of path patching by torch's own forward pre-hooks on o_proj / c_proj
    (input: the heads' z side by side, (B, T, H·D)), without attnlab's hook points."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    D = model.config.hidden_size // H
    projections = [_projection(model, layer) for layer in range(L)]

    def columns(head):
        return slice(head * D, (head + 1) * D)

    def run(ids, make_hook):
        handles = [p.register_forward_pre_hook(make_hook(layer))
                   for layer, p in enumerate(projections)]
        try:
            return model(input_ids=ids).logits
        finally:
            for handle in handles:
                handle.remove()

    def reader(into):
        return lambda layer: (lambda module, args: into.update({layer: args[0].clone()}))

    clean_z, dirty_z, kept = {}, {}, {}
    with torch.no_grad():
        run(IDS, reader(clean_z))
        run(CORRUPTED, reader(dirty_z))

        def first(layer):
            def hook(module, args):
                z = dirty_z[layer].clone()  # every head frozen at the corrupted run
                if layer == sender[0]:
                    z[:, positions, columns(sender[1])] = clean_z[layer][
                        :, positions, columns(sender[1])]
                for receiver_layer, head in receivers:
                    if receiver_layer == layer:
                        z[..., columns(head)] = args[0][..., columns(head)]
                        kept[(layer, head)] = args[0][..., columns(head)].clone()
                return (z,)
            return hook

        run(CORRUPTED, first)

        def second(layer):
            def hook(module, args):
                z = args[0].clone()
                for receiver_layer, head in receivers:
                    if receiver_layer == layer:
                        z[..., columns(head)] = kept[(layer, head)]
                return (z,)
            return hook

        return run(CORRUPTED, second)


@pytest.mark.parametrize(("kind", "sender", "receivers", "positions"), [
    ("llama3", (0, 1), [(2, 0), (2, 3)], [2, 3]),
    ("llama3", (0, 2), [(1, 1), (2, 2)], None),
    ("gpt2", (0, 3), [(1, 0)], [2]),
])
def test_path_patch_equals_the_two_runs_by_hand(models, kind, sender, receivers,
                                                positions) -> None:
    from attnlab.lens.hf_lens import path_patch

    model = _three_layer_llama() if kind == "llama3" else models[kind]
    expected = _reference_path_patch(model, sender, receivers,
                                     positions if positions is not None else slice(None))
    with torch.no_grad():
        got = path_patch(model, {"input_ids": IDS}, {"input_ids": CORRUPTED}, sender=sender,
                         receivers=receivers, positions=positions).logits
        direct = patch(model, {"input_ids": IDS}, {"input_ids": CORRUPTED}, heads=[sender],
                       positions=positions).logits
        dirty = model(input_ids=CORRUPTED).logits
    # the same float32 operations on the same values: 1e-6
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-6)
    assert (got - dirty).abs().max() > 1e-5  # the sender's path did change something
    assert (got - direct).abs().max() > 1e-5  # and not as much as all its paths


def test_path_patch_sanity_cases() -> None:
    from attnlab.lens.hf_lens import path_patch

    model = _three_layer_llama()
    with torch.no_grad():
        clean = model(input_ids=IDS).logits
        dirty = model(input_ids=CORRUPTED).logits
        # The clean run patched into itself: nothing changes (same operations: 1e-6).
        itself = path_patch(model, {"input_ids": IDS}, {"input_ids": IDS}, sender=(0, 1),
                            receivers=[(1, 0), (2, 3)]).logits
        np.testing.assert_allclose(itself.numpy(), clean.numpy(), atol=1e-6)
        # Causal: the sender patched at the last position only reaches the receivers'
        # last row; every earlier position keeps the corrupted run's logits.
        last = path_patch(model, {"input_ids": IDS}, {"input_ids": CORRUPTED}, sender=(0, 1),
                          receivers=[(1, 0), (2, 3)], positions=[-1]).logits
        np.testing.assert_allclose(last[0, :-1].numpy(), dirty[0, :-1].numpy(), atol=1e-6)
        assert (last[0, -1] - dirty[0, -1]).abs().max() > 1e-5
        # A sender whose W_O slice is zero writes nothing into the stream: no receiver
        # can read it, whatever its z.
        silent = _three_layer_llama()
        silent.model.layers[0].self_attn.o_proj.weight[:, 1 * 8:2 * 8] = 0
        cut = path_patch(silent, {"input_ids": IDS}, {"input_ids": CORRUPTED}, sender=(0, 1),
                         receivers=[(1, 0), (2, 3)]).logits
        np.testing.assert_allclose(cut.numpy(), silent(input_ids=CORRUPTED).logits.numpy(),
                                   atol=1e-6)


def test_bad_path_patch_requests_are_named(models) -> None:
    from attnlab.lens.hf_lens import path_patch

    model, clean, dirty = models["llama"], {"input_ids": IDS}, {"input_ids": CORRUPTED}
    with pytest.raises(AttnlabError, match="receivers: expected heads in layers after"):
        path_patch(model, clean, dirty, sender=(1, 0), receivers=[(1, 1)])
    with pytest.raises(AttnlabError, match="receivers: expected at least one"):
        path_patch(model, clean, dirty, sender=(0, 0), receivers=[])
    with pytest.raises(AttnlabError, match=r"sender: expected \(layer, head\) pairs"):
        path_patch(model, clean, dirty, sender=(0, 4), receivers=[(1, 0)])
    with pytest.raises(AttnlabError, match=r"receivers: expected a list of \(layer, head\)"):
        path_patch(model, clean, dirty, sender=(0, 0), receivers=None)
    with pytest.raises(AttnlabError, match=r"positions: expected positions in \[-9, 9\)"):
        path_patch(model, clean, dirty, sender=(0, 0), receivers=[(1, 0)], positions=[9])
    with pytest.raises(AttnlabError, match="corrupted: expected inputs of the clean run's"):
        path_patch(model, clean, {"input_ids": IDS[:, :5]}, sender=(0, 0), receivers=[(1, 0)])


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_ablation_effects_are_the_relative_change_weight_surgery_gives(models, kind) -> None:
    from attnlab.lens.hf_lens import ablation_effects

    model = models[kind]
    effects = ablation_effects(model, input_ids=IDS)
    assert effects.shape == (2, 4) and (effects > 0).all()
    with torch.no_grad():
        plain = model(input_ids=IDS).logits.double()
        for layer, head in ((0, 1), (1, 2)):
            edited = _surgery(model, layer, head)(input_ids=IDS).logits.double()
            expected = float((edited - plain).norm() / plain.norm())
            # float32 logits, the same operations on zeros instead of zeroed weights
            assert effects[layer, head] == pytest.approx(expected, rel=1e-4, abs=1e-7)

    def metric(output):  # log-probability of one token at the last position
        return torch.log_softmax(output.logits[0, -1], dim=-1)[2003]

    drops = ablation_effects(model, metric, input_ids=IDS)
    with torch.no_grad():
        expected = float(metric(model(input_ids=IDS))) - float(
            metric(_surgery(model, 1, 2)(input_ids=IDS)))
    assert drops[1, 2] == pytest.approx(expected, abs=1e-5)
    with pytest.raises(AttnlabError, match="metric: expected a function"):
        ablation_effects(model, 3, input_ids=IDS)
