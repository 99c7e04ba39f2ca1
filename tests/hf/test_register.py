"""attnlab registered in transformers (``attn_implementation="attnlab"``) against transformers'
own eager and sdpa attention, on small random models of eight architectures and the real
MiniLM, saved with ``save_pretrained`` and loaded back.

Which reference, and why:
- float32: eager, the implementation every other one is checked against. Tolerance
  2e-5 on hidden states: these are ~1 in size, two float32 attentions differ in their
  summation order by a few ulps (~1e-7) per layer, grown by the layers' norms and
  MLPs; measured max 1.2e-6 (docs/hf.md).
- float64: eager is no reference there (Llama-like models upcast softmax to float32,
  and a left-padded row gives NaN), so attnlab's plain path in float64 is compared
  with transformers' sdpa in float64: 1e-10 (both exact to ~1e-15 per op).
Only real tokens are compared: padded positions' states are whatever each
implementation leaves there.
"""

from __future__ import annotations

import pytest
import torch

import attnlab.hf
from attnlab.errors import AttnlabError
from attnlab.hf.attention import attention_function

from . import tiny_models as tm


def _hidden(model, inputs):
    out = model(**inputs, output_hidden_states=True)
    return torch.stack(out.hidden_states)  # (L + 1, B, T, E)


def _max_error(a, b, real):
    return (a - b)[:, real].abs().max().item()  # over layers, real tokens only


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("arch", tm.ARCHITECTURES)
def test_hidden_states_equal_eager_in_float32(arch, padding_side):
    inputs = tm.batch(padding_side)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        got = _hidden(tm.load(arch, "attnlab"), inputs)
        want = _hidden(tm.load(arch, "eager"), inputs)
    assert _max_error(got, want, real) < 2e-5


@pytest.mark.parametrize("arch", ["bert", "llama", "gemma2", "gpt_oss", "mistral"])
def test_float64_plain_path_equals_sdpa_in_float64_under_left_padding(arch):
    inputs = tm.batch("left")
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        got = _hidden(tm.load(arch, "attnlab_plain", torch.float64), inputs)
        if arch == "gemma2":  # sdpa refuses Gemma 2's soft cap; eager is no float64 reference
            eager = _hidden(tm.load(arch, "eager", torch.float64), inputs)
            assert torch.isnan(eager[:, real]).any()  # left padding in float64: NaN
            inputs = tm.batch("right", tm.TEXTS[:1])  # so compare without padding (with
            real = inputs["attention_mask"].bool()  # it, NaN too: 0 weight · NaN value)
            got = _hidden(tm.load(arch, "attnlab_plain", torch.float64), inputs)
            want = _hidden(tm.load(arch, "eager", torch.float64), inputs)
            tolerance = 1e-5  # eager's float32 softmax, ~1e-7 relative per layer
        else:  # GPT-OSS has no sdpa; its eager softmax stays in float64 (and a sink
            # keeps every row finite), so there eager is a float64 reference
            want = _hidden(tm.load(arch, tm.reference_implementation(arch), torch.float64),
                           inputs)
            tolerance = 1e-10
    assert torch.isfinite(got[:, real]).all()
    assert _max_error(got, want, real) < tolerance


def test_padding_is_honoured_a_padded_row_equals_the_sentence_alone():
    """The mask function is registered: without it transformers passes no mask and the
    padded row's real tokens attend to padding (errors ~1 measured)."""
    model = tm.load("llama", "attnlab")
    inputs = tm.batch("left")
    short = inputs["attention_mask"][1].bool()
    alone = {"input_ids": inputs["input_ids"][1:, short[None].expand(1, -1)[0]]}
    with torch.no_grad():
        padded = model(**inputs).logits[1, short]
        single = model(**alone).logits[0]
    torch.testing.assert_close(padded, single, atol=2e-5, rtol=0)


def test_real_minilm_equals_eager():
    inputs = tm.batch("right", ["小明去了学校", "attention is all you need and more"])
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        got = _hidden(tm.load_minilm("attnlab"), inputs)
        want = _hidden(tm.load_minilm("eager"), inputs)
    assert _max_error(got, want, real) < 2e-5


@pytest.mark.parametrize("arch", ["bert", "gpt2", "llama", "gpt_oss", "gemma2"])
def test_output_attentions_returns_eagers_weights(arch):
    inputs = tm.batch("left")
    with torch.no_grad():
        got = tm.load(arch, "attnlab")(**inputs, output_attentions=True).attentions
        want = tm.load(arch, "eager")(**inputs, output_attentions=True).attentions
    assert len(got) == len(want) and got[0] is not None
    real_rows = inputs["attention_mask"].bool()[:, None, :, None]  # (B, 1, T, 1)
    for layer_got, layer_want in zip(got, want, strict=True):
        diff = (layer_got - layer_want).abs().masked_fill(~real_rows, 0.0)
        assert diff.max().item() < 1e-6  # weights in [0, 1]; float32 rounding


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt_oss"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generate_gives_sdpas_tokens(arch, cache):
    """A left-padded batch, decoded greedily with each cache (GPT-OSS has no sdpa: its
    eager). The unpadded StaticCache prefill is checked on logits below: on these small
    random models its tokens alone would not show a wrong alignment."""
    inputs = tm.batch("left")
    options = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    if cache == "static":
        options["cache_implementation"] = "static"
    got = tm.load(arch, "attnlab").generate(**inputs, **options)
    want = tm.load(arch, tm.reference_implementation(arch)).generate(**inputs, **options)
    assert torch.equal(got, want)


@pytest.mark.parametrize("arch", ["llama", "gpt_oss", "gemma2"])
def test_training_gradients_equal_eagers(arch):
    """Every parameter's gradient, GPT-OSS's sinks and Gemma 2's capped scores included;
    tolerance 1e-4 relative to the largest gradient (float32, two summation orders)."""
    inputs = tm.batch("right")
    grads = {}
    for implementation in ("attnlab", "eager"):
        model = tm.load(arch, implementation).train()
        labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        model(**inputs, labels=labels).loss.backward()
        grads[implementation] = {n: p.grad for n, p in model.named_parameters()
                                 if p.grad is not None}
    assert grads["attnlab"].keys() == grads["eager"].keys()
    if arch == "gpt_oss":
        assert any(name.endswith("sinks") for name in grads["attnlab"])
    for name, want in grads["eager"].items():
        scale = max(want.abs().max().item(), 1e-6)
        error = (grads["attnlab"][name] - want).abs().max().item()
        assert error <= 1e-4 * scale, (name, error, scale)


def test_torch_compile_fullgraph():
    model = tm.load("llama", "attnlab")
    inputs = tm.batch("right")
    with torch.no_grad():
        want = model(**inputs).logits
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        got = compiled(**inputs).logits
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_register_is_idempotent_and_checks_its_arguments():
    assert attnlab.hf.register("attnlab") == "attnlab"
    assert attnlab.hf.register("attnlab") == "attnlab"
    assert attnlab.hf.registered_backend("attnlab") == "torch"
    from transformers.masking_utils import AttentionMaskInterface

    assert "attnlab" in AttentionMaskInterface._global_mapping
    with pytest.raises(AttnlabError, match=r"backend: expected one of"):
        attnlab.hf.register("attnlab_x", backend="cuda")
    with pytest.raises(AttnlabError, match=r"name: expected a new attention implementation"):
        attnlab.hf.register("sdpa")


def test_unknown_keywords_are_refused_by_name():
    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 4)
    function = attention_function("torch")
    with pytest.raises(AttnlabError, match=r"cu_seq_lens_q: attnlab's Hugging Face attention "
                                           r"does not implement"):
        function(module, q, q, q, None, cu_seq_lens_q=torch.tensor([0, 3]))
    with pytest.raises(AttnlabError, match=r"position_bias"):
        function(module, q, q, q, None, position_bias=torch.zeros(1, 2, 3, 3))


def test_triton_backend_on_the_cpu_says_so():
    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(AttnlabError, match=r"backend: 'triton' runs attnlab's Triton kernels "
                                           r"on CUDA tensors"):
        attention_function("triton")(module, q, q, q, None)


def test_dropout_in_training_reaches_the_kernel():
    """transformers passes dropout > 0 in training: the output changes with the seed, and
    in eval mode (dropout 0) it does not."""
    module = torch.nn.Module()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=gen) for _ in range(3))
    function = attention_function("torch")
    torch.manual_seed(1)
    first = function(module, q, k, v, None, dropout=0.5, is_causal=False)[0]
    torch.manual_seed(2)
    second = function(module, q, k, v, None, dropout=0.5, is_causal=False)[0]
    assert not torch.equal(first, second)
    plain = function(module, q, k, v, None, dropout=0.0, is_causal=False)[0]
    expected = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v  # written out
    torch.testing.assert_close(plain, expected.transpose(1, 2), atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_cache_prefill_is_top_left_aligned(arch):
    """An empty StaticCache's prefill: no mask, T queries, S = max_cache_len > T keys, the
    keys past T empty. transformers means torch's top-left causal rule there; bottom-right
    would let query i see keys up to S - T + i (logits then off by 0.25 and 0.34)."""
    from transformers import StaticCache

    inputs = tm.batch("left", tm.TEXTS[:1])
    T = inputs["input_ids"].shape[1]
    logits = {}
    for implementation in ("attnlab", "sdpa"):
        model = tm.load(arch, implementation)
        cache = StaticCache(config=model.config, max_cache_len=T + 8)
        with torch.no_grad():
            logits[implementation] = model(**inputs, cache=cache,
                                           use_cache=True).logits
    torch.testing.assert_close(logits["attnlab"], logits["sdpa"], atol=2e-5, rtol=0)


def test_triton_reads_transformers_masks_back_as_key_padding():
    """The triton backend's mask reading (CPU-testable; the kernels need CUDA): a padded
    causal mask and a padded encoder mask become (key padding, causal); a sliding window
    is refused by name."""
    from attnlab.hf.attention import _as_key_padding

    B, T = 2, 5
    real = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], dtype=torch.bool)  # left padding
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    padded_causal = real[:, None, None, :] & causal  # (B, 1, T, S) as sdpa_mask builds it
    key_padding, is_causal = _as_key_padding(padded_causal, T, T)
    assert torch.equal(key_padding, real) and is_causal
    encoder = real[:, None, None, :].expand(B, 1, T, T)
    key_padding, is_causal = _as_key_padding(encoder, T, T)
    assert torch.equal(key_padding, real) and not is_causal
    window = padded_causal & torch.ones(T, T, dtype=torch.bool).triu(-1)  # 2 most recent
    with pytest.raises(AttnlabError, match=r"attention_mask: backend='triton' takes key "
                                           r"padding"):
        _as_key_padding(window, T, T)
