"""attnlab.lens.hf_runs: what it reads from a Hugging Face model is what the model computes.

References, independent of the reader: transformers' own eager ``output_attentions``
(a second copy of the model), ``generate`` under the model's default (sdpa) attention,
and value norms computed by hand from ``v_proj`` / ``c_attn`` and ``o_proj`` / ``c_proj``
weights. Small random Llama (grouped heads, RoPE) and GPT-2 folders with MiniLM's
tokenizer (tests/support/hf_folders.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from tests.support.hf_folders import gpt2_folder, llama_folder

import attnlab.hf
from attnlab.errors import AttnlabError
from attnlab.lens.hf_runs import load_hf, run_hf

attnlab.hf.register()  # load_hf's default attn_implementation="attnlab"

TEXT = "The cat sat on the mat because it was warm."


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {"llama": llama_folder(root / "llama"), "gpt2": gpt2_folder(root / "gpt2")}


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_weights_are_eagers_output_attentions_and_q_k_give_them(folders, kind) -> None:
    hf = load_hf(str(folders[kind]))
    run = run_hf(hf, TEXT)
    eager = transformers.AutoModelForCausalLM.from_pretrained(
        folders[kind], attn_implementation="eager").eval()
    ids = torch.tensor([run.ids.tolist()])
    with torch.no_grad():
        reference = eager(input_ids=ids, output_attentions=True)
    expected = np.stack([a[0].double().numpy() for a in reference.attentions])
    # hook_pattern is attnlab's softmax of attnlab's scores, eager's is transformers' own:
    # the same float32 inputs through two float32 kernels (other op order, float32
    # rounding ~6e-8 per op on weights in [0, 1]; 3e-8 measured): 1e-6.
    np.testing.assert_allclose(run.weights, expected, rtol=0, atol=1e-6)
    # The logits carry that rounding through 2 layers and the unembedding (|logits| < 1
    # on these random models; 1.8e-7 measured): 1e-6.
    np.testing.assert_allclose(run.logits, reference.logits[0].double().numpy(), rtol=0,
                               atol=1e-6)
    L, H, T, _ = run.weights.shape
    assert run.is_causal and run.prompt_length == T
    # scores = q · kᵀ · scale with −inf above the diagonal, softmax: the recorded q and k
    # are the ones the weights came from (float32 model, float64 recomputation: 1e-6).
    groups = H // run.k.shape[1]
    scores = np.einsum("lhtd,lhsd->lhts", run.q, np.repeat(run.k, groups, axis=1))
    scores = scores * run.scales[:, None, None, None]
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(weights / weights.sum(-1, keepdims=True), run.weights, atol=1e-6)


def test_value_norms_equal_a_hand_computation_llama(folders) -> None:
    hf = load_hf(str(folders["llama"]))
    run = run_hf(hf, TEXT)
    model, layer = hf.model, 1
    seen = {}
    attention = model.model.layers[layer].self_attn
    handle = attention.register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(x=kwargs["hidden_states"]), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=torch.tensor([run.ids.tolist()]))
        handle.remove()
        D = attention.head_dim
        v = attention.v_proj(seen["x"])[0].view(-1, 2, D)  # (T, Hkv, D): no RoPE on values
        for h in range(4):
            w_o = attention.o_proj.weight[:, h * D:(h + 1) * D]  # (E, D)
            hand = (v[:, h // 2] @ w_o.T).norm(dim=-1).double().numpy()  # (T,)
            np.testing.assert_allclose(run.value_norms[layer, h], hand, rtol=1e-5)


def test_value_norms_equal_a_hand_computation_gpt2(folders) -> None:
    hf = load_hf(str(folders["gpt2"]))
    run = run_hf(hf, TEXT)
    block = hf.model.transformer.h[0]
    with torch.no_grad():
        x = hf.model.transformer.wte(torch.tensor(run.ids)) + hf.model.transformer.wpe(
            torch.arange(len(run.ids)))
        _, _, v = block.attn.c_attn(block.ln_1(x)).split(32, dim=-1)  # (T, E) each
        D = 8
        for h in range(4):
            w_o = block.attn.c_proj.weight[h * D:(h + 1) * D]  # Conv1D: x @ W, (D, E)
            hand = (v[:, h * D:(h + 1) * D] @ w_o).norm(dim=-1).double().numpy()
            np.testing.assert_allclose(run.value_norms[0, h], hand, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_generated_tokens_are_generates_under_the_default_attention(folders, kind) -> None:
    hf = load_hf(str(folders[kind]))
    run = run_hf(hf, TEXT, generate=6)
    model = transformers.AutoModelForCausalLM.from_pretrained(folders[kind]).eval()
    assert model.config._attn_implementation == "sdpa"
    prompt = hf.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                             do_sample=False, pad_token_id=0)
    assert run.ids.tolist() == out[0].tolist()
    assert run.prompt_length == prompt.shape[1] and len(run.generated) == 6
    assert run.weights.shape[2] == prompt.shape[1] + 6
    assert hf.model.config._attn_implementation == "attnlab"  # read at its hook points


def test_pairs_carry_their_sentences(folders) -> None:
    run = run_hf(load_hf(str(folders["llama"])), "The cat sat.", pair="It was warm.")
    split = run.tokens.index("[SEP]") + 1  # [CLS] A [SEP] | B [SEP]
    assert run.segments == [0] * split + [1] * (len(run.tokens) - split)


def test_a_model_off_attnlabs_attention_is_refused_not_misread(folders) -> None:
    hf = load_hf(str(folders["llama"]), attn_implementation="eager")
    with pytest.raises(AttnlabError, match="attn_implementation='eager'.*attnlab.hf.register"):
        run_hf(hf, TEXT)
    with pytest.raises(AttnlabError, match="attn_implementation: expected 'eager', 'sdpa' or "
                       "a name registered"):
        load_hf(str(folders["llama"]), attn_implementation="no-such-attention")


def test_bad_requests_are_one_clear_error(folders, tmp_path) -> None:
    from attnlab.models.loading import minilm_path

    encoder = load_hf(str(minilm_path()))
    assert not encoder.is_decoder
    with pytest.raises(AttnlabError, match="generate: .* is an encoder"):
        run_hf(encoder, TEXT, generate=2)
    with pytest.raises(AttnlabError, match=r"model: cannot load 'someone/no-such-model' from "
                       r"the Hugging Face hub \(offline or unknown"):
        load_hf("someone/no-such-model")
    with pytest.raises(AttnlabError, match="model: expected a Hugging Face folder"):
        load_hf(str(tmp_path / "missing"))
    with pytest.raises(AttnlabError, match="text: expected some text"):
        run_hf(encoder, "  ")


def test_scales_without_scaling_are_fitted_and_checked(folders) -> None:
    """A module without ``scaling``: the least-squares scale of the model's own scores,
    which is Llama's 1/√D; a wrong ``scaling`` is caught, not shown as the score."""
    from types import SimpleNamespace

    from attnlab.lens.hf_points import attention_modules
    from attnlab.lens.hf_runs import score_scales

    hf = load_hf(str(folders["llama"]))
    run = run_hf(hf, TEXT)
    assert run.neuron_note is None
    np.testing.assert_allclose(run.scales, [8 ** -0.5] * 2, rtol=0, atol=1e-12)
    L, H, T, _ = run.weights.shape
    groups = H // run.k.shape[1]
    scores = np.einsum("lhtd,lhsd->lhts", run.q, np.repeat(run.k, groups, axis=1)) * 8 ** -0.5
    scores = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    bare = [SimpleNamespace() for _ in range(L)]  # no .scaling, no soft cap
    fitted, note = score_scales(hf, bare, run.q, run.k, scores, run.weights)
    assert note is None
    np.testing.assert_allclose(fitted, [8 ** -0.5] * 2, rtol=1e-12)  # float64 fit of exact data
    wrong = [SimpleNamespace(scaling=0.5) for _ in range(L)]
    scales, note = score_scales(hf, wrong, run.q, run.k, scores, run.weights)
    assert scales is None and note is not None and note.key == "hf.neuron_scale"
    assert "layer 1" in note.render("en")
    assert len(attention_modules(hf.model)) == L


def test_a_soft_capped_model_has_no_neuron_view(tmp_path, capsys) -> None:
    """Gemma 2 caps its scores (cap·tanh(s/cap)): q·k × scale is not the score, so run_hf
    gives no scales and says why, and inspect's page has no neuron view."""
    from tests.hf.tiny_models import saved

    from attnlab.cli.app import main

    folder = saved("gemma2")
    hf = load_hf(str(folder))
    run = run_hf(hf, TEXT)
    assert run.scales is None and run.neuron_note is not None
    assert run.neuron_note.key == "hf.neuron_softcap"
    assert "softcap 2.0" in run.neuron_note.render("en")
    assert "上限压缩" in run.neuron_note.render("zh")
    assert np.isfinite(run.weights).all()  # the weights are still there
    code = main(["inspect", "--model", str(folder), TEXT, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0 and "note: no neuron view for" in err and "softcap 2.0" in err, err
    html = (tmp_path / "view.html").read_text(encoding="utf-8")
    assert '"neuron"' not in html and '"value_norms"' in html
