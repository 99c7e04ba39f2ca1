"""Inputs chosen to break things: each gives the right result or one clear AttnlabError.

Every test here failed before its fix with a bare exception (IndexError,
MemoryError, RuntimeError, UnicodeEncodeError, ...), a NaN, silently wrong
numbers or a CLI "internal error". Errors are matched on the argument they name
and on what they say was expected, so a message that starts blaming the wrong
argument fails too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attnlab
import attnlab.torch as at
from attnlab.errors import AttnlabError

torch.set_num_threads(1)


def _qkv(*shape_q, S=5, Dv=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    *batch, T, D = shape_q
    q = torch.randn(*batch, T, D, generator=gen, dtype=dtype)
    k = torch.randn(*batch, S, D, generator=gen, dtype=dtype)
    v = torch.randn(*batch, S, Dv, generator=gen, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------- A. masks of any rank


# 1-D and 0-d masks broadcast to (..., T, S) like any other: torch's fused kernel
# indexes dim -2 of its attn_mask, so they used to end in a bare IndexError.
LOW_RANK_MASKS = [
    torch.tensor([True, False, True, True, False]),  # (S,)
    torch.tensor([False, False, False, False, False]),  # (S,), every row fully masked
    torch.tensor(True),  # ()
    torch.tensor(False),  # ()
]


@pytest.mark.parametrize("mask", LOW_RANK_MASKS, ids=["S", "S-none", "0d", "0d-none"])
@pytest.mark.parametrize("return_weights", [False, True])
def test_torch_sdpa_takes_a_mask_of_rank_below_two(mask, return_weights):
    q, k, v = _qkv(2, 3, 4, 8)  # (B, H, T, D), S = 5
    got = at.scaled_dot_product_attention(q, k, v, mask, return_weights=return_weights)
    out = got[0] if return_weights else got
    full = mask.expand(2, 3, 4, 5)  # the mask expanded by hand: (B, H, T, S)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    expected = expected.masked_fill(~full.any(-1, keepdim=True), 0.0)  # attnlab: no key -> 0
    # float64 end to end: the two kernels differ only in summation order.
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    numpy_out = attnlab.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                     mask.numpy())
    np.testing.assert_allclose(out.numpy(), numpy_out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [torch.tensor([0.0, -1.0, float("-inf"), 2.0, 0.5]),
                                  torch.tensor(-3.0)], ids=["S", "0d"])
def test_torch_sdpa_takes_a_bias_of_rank_below_two(bias):
    q, k, v = _qkv(2, 3, 4, 8)
    out = at.scaled_dot_product_attention(q, k, v, bias=bias)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.expand(2, 3, 4, 5))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)  # float64, as above
    plain = at.scaled_dot_product_attention(q, k, v, bias=bias, return_weights=True)[0]
    torch.testing.assert_close(out, plain, rtol=1e-12, atol=1e-12)


def test_torch_sdpa_takes_a_1d_mask_and_a_1d_bias_together():
    q, k, v = _qkv(2, 3, 4, 8)
    mask, bias = torch.tensor([True, True, False, True, True]), torch.arange(5.0).double()
    out = at.scaled_dot_product_attention(q, k, v, mask, bias=bias)
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.masked_fill(~mask, float("-inf")).expand(2, 3, 4, 5))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)  # float64


def test_torch_multihead_takes_a_1d_mask_without_weights():
    torch.manual_seed(0)
    mha = at.MultiHeadAttention(2, 8, dtype=torch.float64)
    x, mask = torch.randn(2, 5, 8, dtype=torch.float64), torch.tensor([True, False] * 2 + [True])
    out = mha(x, x, x, mask, need_weights=False)
    with_weights, _ = mha(x, x, x, mask, need_weights=True)
    torch.testing.assert_close(out, with_weights, rtol=1e-12, atol=1e-12)  # float64, two paths


# ---------------------------------------------------------------- F. tensors the core cannot read


def test_numpy_core_names_a_tensor_that_requires_grad():
    q = torch.ones(3, 4, requires_grad=True)
    with pytest.raises(AttnlabError, match=r"^q: expected a NumPy array, got a Tensor that "
                                           r"requires grad; pass q\.detach\(\)"):
        attnlab.scaled_dot_product_attention(q, np.ones((5, 4)), np.ones((5, 2)))
    with pytest.raises(AttnlabError, match=r"^mask: expected a NumPy array"):
        attnlab.scaled_dot_product_attention(
            np.ones((3, 4)), np.ones((5, 4)), np.ones((5, 2)), torch.ones(3, 5, requires_grad=True))


META = "on the meta device, which holds none"


def _meta(*shape):
    return torch.zeros(*shape, device="meta")


@pytest.mark.parametrize("call,name", [
    (lambda: at.scaled_dot_product_attention(_meta(3, 4), _meta(5, 4), _meta(5, 2)), "q"),
    (lambda: at.scaled_dot_product_attention(_meta(3, 4), _meta(5, 4), _meta(5, 2),
                                             return_weights=True), "q"),
    (lambda: at.scaled_dot_product_attention(_meta(3, 4), _meta(5, 4), _meta(5, 2),
                                             bias=_meta(3, 5)), "bias"),
    (lambda: at.softmax(_meta(3, 4)), "x"),
    (lambda: at.apply_rope(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long,
                                                          device="meta")), "positions"),
    (lambda: at.MultiHeadAttention(2, 8, device="meta")(_meta(2, 3, 8), _meta(2, 3, 8),
                                                        _meta(2, 3, 8)), "query"),
    (lambda: at.KVCache(1, 1, 4, device="meta").attend(_meta(1, 1, 2, 4), _meta(1, 1, 2, 4),
                                                       _meta(1, 1, 2, 4)), "k"),
], ids=["sdpa", "sdpa-weights", "bias", "softmax", "rope", "mha", "kv-cache"])
def test_torch_names_a_meta_tensor_instead_of_failing_in_item(call, name):
    with pytest.raises(AttnlabError, match=rf"^{name}: expected a tensor holding values .*{META}"):
        call()


# ---------------------------------------------------------------- H, I. flags and scalars


@pytest.mark.parametrize("flag", ["no", "", 0, 1, None, np.array(True), torch.tensor(True)],
                         ids=["str", "empty-str", "0", "1", "None", "0d-array", "0d-tensor"])
def test_both_twins_refuse_a_flag_that_is_not_a_bool(flag):
    q = np.ones((3, 4))
    for name in ("return_weights", "is_causal"):
        with pytest.raises(AttnlabError, match=rf"^{name}: expected True or False, got "):
            attnlab.scaled_dot_product_attention(q, q, q, **{name: flag})
        with pytest.raises(AttnlabError, match=rf"^{name}: expected True or False, got "):
            at.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4),
                                             torch.ones(3, 4), **{name: flag})


@pytest.mark.parametrize("scale", [np.float32(0.5), np.float64(0.25), np.int64(2), 3, 0.5])
@pytest.mark.parametrize("is_causal", [np.bool_(True), np.bool_(False), True])
def test_both_twins_take_numpy_scalars_and_agree(scale, is_causal):
    q, k, v = _qkv(2, 4, 8, S=4)
    numpy_out, numpy_weights = attnlab.scaled_dot_product_attention(
        q.numpy(), k.numpy(), v.numpy(), scale=scale, is_causal=is_causal,
        return_weights=np.bool_(True))
    for return_weights in (False, True):
        got = at.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=is_causal,
                                              return_weights=return_weights)
        out = got[0] if return_weights else got
        # float64 on both sides; the fused kernel sums in another order.
        np.testing.assert_allclose(out.numpy(), numpy_out, rtol=1e-12, atol=1e-12)
    assert numpy_weights.shape == (2, 4, 4)


@pytest.mark.parametrize("scale,message", [
    ("0.5", "expected a real number or None, got '0.5'"),
    (True, "expected a real number or None, got True"),
    (np.bool_(True), "expected a real number or None, got "),
    (np.array(0.5), "expected a real number or None, got "),
    (torch.tensor(0.5), "expected a real number or None, got "),
    (float("nan"), "expected a finite number, got nan"),
    (np.float32("inf"), "expected a finite number, got inf"),
    (1 + 2j, "expected a real number or None, got "),
])
def test_both_twins_refuse_the_same_bad_scales(scale, message):
    q = np.ones((3, 4))
    with pytest.raises(AttnlabError, match=rf"^scale: {message}"):
        attnlab.scaled_dot_product_attention(q, q, q, scale=scale)
    with pytest.raises(AttnlabError, match=rf"^scale: {message}"):
        at.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4), torch.ones(3, 4),
                                        scale=scale)


def test_other_flags_are_checked_not_truth_tested():
    x = np.ones((1, 3, 8))
    mha = attnlab.MultiHeadAttention.init(8, 2, seed=0)
    with pytest.raises(AttnlabError, match=r"^return_weights: expected True or False, got 'no'$"):
        mha(x, return_weights="no")
    with pytest.raises(AttnlabError, match=r"^interleaved: expected True or False, got 'yes'$"):
        attnlab.apply_rope(np.ones((3, 4)), interleaved="yes")
    with pytest.raises(AttnlabError, match=r"^interleaved: expected True or False, got 1$"):
        at.apply_rope(torch.ones(3, 4), interleaved=1)
    model = attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=11, d_model=8, num_heads=2))
    with pytest.raises(AttnlabError, match=r"^greedy: expected True or False, got 'False'$"):
        model.generate([1, 2], 2, greedy="False")


@pytest.mark.parametrize("twin", ["numpy", "torch"])
def test_kv_cache_refuses_a_query_with_no_heads_and_appends_nothing(twin):
    lib, make = (attnlab, np.zeros) if twin == "numpy" else (at, torch.zeros)
    cache = lib.KVCache(1, 2, 4)
    k = make((1, 2, 3, 4))
    with pytest.raises(AttnlabError, match=r"^q: expected \(B, H, T, D\) = \(1, H, 3, 4\) "
                                           r"with H a positive multiple of Hkv = 2"):
        cache.attend(make((1, 0, 3, 4)), k, k)
    assert cache.length == 0  # refused before anything was written


@pytest.mark.parametrize("scale", [np.float32(0.5), np.int64(2)])
def test_kv_cache_twins_take_numpy_scalars_and_agree(scale):
    q, k, v = _qkv(1, 4, 3, 4, S=3, Dv=4)  # (B, H, T, D) with H = Hkv = 4
    numpy_cache, torch_cache = attnlab.KVCache(1, 4, 4), at.KVCache(1, 4, 4, dtype=torch.float64)
    expected = numpy_cache.attend(q.numpy(), k.numpy(), v.numpy(), scale=scale)
    got = torch_cache.attend(q, k, v, scale=scale)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)  # float64


# ---------------------------------------------------------------- D. sampling at tiny temperatures


def test_sampling_at_a_tiny_temperature_is_greedy_not_token_zero():
    model = attnlab.TinyDecoder(
        attnlab.DecoderConfig(vocab_size=50, d_model=16, num_heads=2, dtype="float64"), seed=1)
    greedy = model.generate([[3, 1, 4], [1, 5, 9]], 6)
    for temperature in (1e-310, 5e-324, 1e-300, 1e-30):
        sampled = model.generate([[3, 1, 4], [1, 5, 9]], 6, greedy=False,
                                 temperature=temperature, seed=7)
        np.testing.assert_array_equal(sampled.tokens, greedy.tokens)
    assert (greedy.new_tokens != 0).any()  # the old NaN CDF always picked token 0


def test_sampling_at_a_huge_temperature_is_uniform_not_nan():
    model = attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=4, d_model=8, num_heads=2))
    out = model.generate(np.zeros((400, 1), dtype=np.int64), 1, greedy=False,
                         temperature=1e308, seed=0)
    counts = np.bincount(out.new_tokens.ravel(), minlength=4)
    # 400 uniform draws over 4 tokens: each count is 100 ± 8.7 (one sigma); 40 is 7 sigmas.
    assert (np.abs(counts - 100) < 40).all(), counts


# ---------------------------------------------------------------- E. sizes from arguments


LIMIT = r"more than attnlab's limit of 2,147,483,648 \(attnlab\.errors\.MAX_ELEMENTS\)"

HUGE = [
    (lambda: attnlab.causal_mask(10**6), r"T: the causal mask \(T, S\) = \(1000000, 1000000\)"),
    (lambda: attnlab.causal_mask(3, 10**10), r"T, S: the causal mask \(T, S\)"),
    (lambda: at.causal_mask(10**6), r"T: the causal mask \(T, S\)"),
    (lambda: attnlab.sliding_window_mask(10**6, 3, is_causal=True),
     r"T: the sliding-window mask \(T, S\)"),
    (lambda: at.sliding_window_mask(10**6, 3), r"T: the sliding-window mask \(T, S\)"),
    (lambda: attnlab.block_sparse_mask(10**6, 64), r"T: the block-sparse mask \(T, S\)"),
    (lambda: attnlab.fast.sparse.bigbird_layout(10**6), r"num_blocks: the block layout \(n, n\)"),
    (lambda: attnlab.alibi_bias(8, 10**5), r"num_heads, T: the bias \(H, T, S\)"),
    (lambda: at.alibi_bias(8, 10**5), r"num_heads, T: the bias \(H, T, S\)"),
    (lambda: attnlab.alibi_slopes(10**10), r"num_heads: the slopes \(H,\)"),
    (lambda: at.alibi_slopes(10**10), r"num_heads: the slopes \(H,\)"),
    (lambda: attnlab.sinusoidal_encoding(10**9, 512), r"max_len, d_model: the table"),
    (lambda: at.sinusoidal_encoding(10**9, 512), r"max_len, d_model: the table"),
    (lambda: attnlab.SinusoidalPositionalEncoding(512, 10**9), r"max_len, d_model: the table"),
    (lambda: attnlab.LearnedPositionalEmbedding(10**9, 512), r"max_len, d_model: the table"),
    (lambda: at.PositionalEncoding(512, 10**9), r"max_len, d_model: the table"),
    (lambda: attnlab.init_weight(10**6, 10**6, rng=0), r"fan_in, fan_out: the weight"),
    (lambda: attnlab.MultiHeadAttention.init(10**6, 1), r"fan_in, fan_out: the weight"),
    (lambda: attnlab.KVCache(1, 8, 64, capacity=10**9), r"capacity: the cache's buffer"),
    (lambda: attnlab.KVCache(1, 8, 64, max_len=10**9), r"max_len: the cache's buffer"),
    (lambda: attnlab.SlidingWindowKVCache(1, 8, 64, window=10**9), r"window: the cache's"),
    (lambda: at.KVCache(1, 8, 64, capacity=10**9), r"capacity: the cache's buffer"),
    (lambda: at.KVCache(1, 8, 64, max_len=10**9), r"max_len: the cache's buffer"),
    (lambda: at.SlidingWindowKVCache(1, 8, 64, window=10**9), r"window: the cache's buffer"),
    (lambda: attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=10**9)),
     r"vocab_size, d_model: the embedding \(V, E\)"),
    (lambda: attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=16, d_model=8, num_heads=2))
     .generate([1, 2], 10**9), r"max_new_tokens: the logits \(B, N, V\)"),
]


@pytest.mark.parametrize("call,message", HUGE, ids=[m.split(":")[0] + f"-{i}"
                                                      for i, (_, m) in enumerate(HUGE)])
def test_a_huge_size_is_refused_before_allocating(call, message):
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


@pytest.mark.parametrize("twin", ["numpy", "torch"])
def test_a_kv_cache_refuses_to_grow_past_the_limit(twin, monkeypatch):
    monkeypatch.setattr(attnlab.errors, "MAX_ELEMENTS", 1000)
    lib, make = (attnlab, np.zeros) if twin == "numpy" else (at, torch.zeros)
    cache = lib.KVCache(1, 2, 4, capacity=100)  # (1, 2, 100, 4): 800 elements
    cache.append(make((1, 2, 100, 4)), make((1, 2, 100, 4)))
    with pytest.raises(AttnlabError, match=r"^k: the cache's buffer \(B, Hkv, length, D\) = "
                                           r"\(1, 2, 200, 4\) would hold 1,600 elements"):
        cache.append(make((1, 2, 1, 4)), make((1, 2, 1, 4)))
    assert cache.length == 100


# ---------------------------------------------------------------- G. traces, views, files


@pytest.mark.parametrize("precision", [-1, 1.5, True, 18, "4"])
def test_trace_text_refuses_a_bad_precision(precision):
    trace = attnlab.explain()
    for render in (trace.to_text, trace.to_markdown):
        with pytest.raises(AttnlabError, match=r"^precision: expected an integer number of "
                                               r"decimals in 0\.\.17, got "):
            render("en", precision=precision)


def test_trace_text_takes_the_extreme_precisions():
    trace = attnlab.explain()
    assert "0.6652" not in trace.to_text(precision=0)
    assert trace.to_text(precision=np.int64(17)).count(".") > 10


def test_attention_view_reads_a_generator_of_tokens_once():
    from attnlab.report.viewer import AttentionView

    weights = np.full((1, 2, 3, 3), 1 / 3)
    view = AttentionView(weights, (t for t in ["a", "b", "c"]),
                         key_tokens=(t for t in ["x", "y", "z"]))
    assert '"tokens":["a","b","c"]' in view.html and '"key_tokens":["x","y","z"]' in view.html


LONE = r"expected text that can be written as UTF-8, got .* with the lone surrogate"


def test_a_lone_surrogate_token_is_named_before_anything_is_written(tmp_path):
    from attnlab.report.viewer import AttentionView

    trace = attnlab.explain()
    trace.tokens = ["a", "caf\udce9", "c"]  # what undecodable bytes become in a str
    with pytest.raises(AttnlabError, match=rf"^tokens\[1\]: {LONE} '\\udce9' at index 3"):
        trace.save(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(AttnlabError, match=rf"^tokens\[1\]: {LONE}"):
        attnlab.explain(tokens=["a", "caf\udce9"])
    with pytest.raises(AttnlabError, match=rf"^tokens\[0\]: {LONE}"):
        AttentionView(np.full((1, 1, 2, 2), 0.5), ["\ud800", "b"])
    with pytest.raises(AttnlabError, match=rf"^title: {LONE}"):
        AttentionView(np.full((1, 1, 2, 2), 0.5), ["a", "b"], title="\udcff")


def test_saving_under_a_regular_file_names_the_file(tmp_path):
    from attnlab.report.heatmaps import plot_attention, save_figure
    from attnlab.report.viewer import AttentionView

    (tmp_path / "file").write_text("")
    trace = attnlab.explain()
    with pytest.raises(AttnlabError, match=r"^out_dir: cannot create the folder .*file/sub'?: "
                                           r".*file'? is a file$"):
        trace.save(tmp_path / "file" / "sub")
    with pytest.raises(AttnlabError, match=r"^out_dir: expected a folder, got .*file'?, "
                                           r"which is a file$"):
        trace.save(tmp_path / "file")
    view = AttentionView(np.full((1, 1, 2, 2), 0.5), ["a", "b"])
    with pytest.raises(AttnlabError, match=r"^path: cannot create the folder .*: .* is a file$"):
        view.save(tmp_path / "file" / "sub" / "view.html")
    with pytest.raises(AttnlabError, match=r"^path: cannot write .* \(Is a directory\)$"):
        view.save(tmp_path)
    with pytest.raises(AttnlabError, match=r"^path: expected a folder, got .*file'?, which is"):
        save_figure(plot_attention(np.eye(2)), tmp_path / "file" / "a.png")


# ---------------------------------------------------------------- B. attnlab inspect --model DIR


def _model_dir(tmp_path, name, config_edit=None, files=None):
    """A copy of the packaged MiniLM's small files, its weights linked, then broken as asked."""
    import json
    import os
    import shutil

    from attnlab.models import minilm_path

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    source, folder = minilm_path(), tmp_path / name
    folder.mkdir()
    for small in ("config.json", "tokenizer.json", "sentence_bert_config.json"):
        shutil.copy(source / small, folder / small)
    try:
        (folder / "model.safetensors").symlink_to(source / "model.safetensors")
    except OSError:  # no symlinks on this file system
        shutil.copy(source / "model.safetensors", folder / "model.safetensors")
    if config_edit is not None:
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        config.update(config_edit)
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for file_name, data in (files or {}).items():
        (folder / file_name).write_bytes(data)
    return folder


BROKEN_MODELS = [
    ({"files": {"config.json": b"5"}},
     "config.json: expected a JSON object of settings, got int 5"),
    ({"files": {"config.json": b'{"hidden_act": "caf\xe9"}'}}, "config.json: not valid UTF-8"),
    ({"config_edit": {"layer_norm_eps": "abc"}},
     "config.json: layer_norm_eps expected a finite number > 0, got 'abc'"),
    ({"config_edit": {"pad_token_id": "x"}},
     "config.json: pad_token_id expected an integer in 0..30521 (vocab_size), got 'x'"),
    ({"config_edit": {"num_hidden_layers": True}},
     "config.json: num_hidden_layers expected a positive integer, got True"),
    ({"config_edit": {"hidden_act": ["gelu"]}}, "config.json: hidden_act expected one of"),
    ({"files": {"tokenizer.json": b"{not json"}}, "tokenizer.json: could not be read ("),
    ({"files": {"sentence_bert_config.json": b"{not json"}},
     "sentence_bert_config.json: not valid JSON ("),
    ({"files": {"sentence_bert_config.json": b'{"max_seq_length": "abc"}'}},
     "sentence_bert_config.json: max_seq_length expected an integer in 1..512 "
     "(max_position_embeddings), got 'abc'"),
    ({"config_edit": {"num_hidden_layers": 30_000_000}},
     "config.json declares num_hidden_layers = 30000000, but the weights hold 6 layers"),
]


@pytest.mark.parametrize("broken,message", BROKEN_MODELS,
                         ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BROKEN_MODELS)])
def test_inspect_names_what_is_wrong_in_a_model_folder(tmp_path, capsys, broken, message):
    import time

    from attnlab.cli.app import main

    folder = _model_dir(tmp_path, "model", **broken)
    start = time.perf_counter()
    code = main(["inspect", "hi", "--model", str(folder), "--out", str(tmp_path / "out")])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    # Sizes are checked against the weight file before anything is built: a config
    # declaring 30 million layers used to run for a minute and take all memory.
    assert elapsed < 20, elapsed


# ---------------------------------------------------------------- C. argv that is not UTF-8


def test_inspect_runs_text_that_is_not_utf8_replacing_the_bad_bytes(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"attnlab", b"inspect", b"caf\xe9 au lait",
         b"--layer", b"1", b"--head", b"1", b"--format", b"json", b"--out",
         str(tmp_path).encode()],
        capture_output=True, env=env, timeout=300,
    )
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 0, err
    assert "note: text: the argument is not valid UTF-8; its undecodable bytes were " \
           "replaced by \ufffd" in err
    assert "internal error" not in err
    assert (tmp_path / "view.html").stat().st_size > 0


def test_explain_takes_tokens_that_are_not_utf8(capsys):
    from attnlab.cli.app import main

    code = main(["explain", "--tokens", "caf\udce9 x"])  # sys.argv's form of b"caf\xe9 x"
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "caf\ufffd | x" in out
    assert "note: --tokens: the argument is not valid UTF-8" in err


# ---------------------------------------------------------------- H. --x fields are not skipped


@pytest.mark.parametrize("spec,message", [
    ("1,,2;3,4", "--x: row 1 of '1,,2;3,4' has an empty field ('1,,2')"),
    ("1,2,;3,4,5", "--x: row 1 of '1,2,;3,4,5' has an empty field ('1,2,')"),
    ("1,2;;3,4", "--x: row 2 of '1,2;;3,4' has an empty row ('')"),
    (";", "--x: row 1 of ';' has an empty row ('')"),
])
def test_explain_refuses_an_empty_field_in_x_instead_of_dropping_it(capsys, spec, message):
    from attnlab.cli.app import main

    code = main(["explain", "--x", spec])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == f"error: {message}; expected numbers separated " \
                                              "by commas, rows by ';'\n"


@pytest.mark.parametrize("spec", ["1,0; 0,2", "1 0; 0 2", "1, 0 ;0 ,2", "1,0;0,2;"])
def test_explain_reads_the_inline_matrix_forms(capsys, spec):
    import json

    from attnlab.cli.app import main

    assert main(["explain", "--x", spec, "--format", "json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["steps"][0]["values"] == [[1.0, 0.0], [0.0, 2.0]]


# ---------------------------------------------------------------- found by test_property_errors.py


@pytest.mark.parametrize("scale", [0.0, -1.0, 1e-300])
def test_torch_causal_attention_with_a_scale_torch_masks_wrongly(scale):
    """torch's fused is_causal applies its -inf mask before the scale: 0·-inf = NaN."""
    q, k, v = _qkv(1, 2, 3, 4, S=3, Dv=4, dtype=torch.float32)
    out = at.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    expected = attnlab.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(),
                                                    is_causal=True, scale=scale)
    # float32; summation orders differ between the fused kernel and NumPy.
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_scale_zero_with_scores_that_overflow_before_scaling_is_refused():
    """q·kᵀ overflows float32 before the scale 0 is applied: inf·0 was NaN."""
    q, k, v = np.float32([[1e20]]), np.float32([[1e20]]), np.float32([[1.0]])
    for attention in (attnlab.scaled_dot_product_attention, attnlab.flash_attention):
        with pytest.raises(AttnlabError, match=r"^q, k: the scores q·kᵀ could reach 1e\+40 "
                                               r"before scaling"):
            attention(q, k, v, scale=0.0)
    with pytest.raises(AttnlabError, match=r"^q, k: the scores q·kᵀ could reach"):
        at.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v)), scale=0.0,
                                        return_weights=True)


def test_a_finite_bias_that_overflows_the_scores_blocks_the_key_without_a_warning():
    import warnings

    q, k = np.float32([[61.0]]), np.float32([[-2.5e30], [0.0]])  # scores -1.5e32, 0
    v = np.float32([[1.0], [2.0]])
    bias = np.float32([np.finfo(np.float32).min, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = attnlab.scaled_dot_product_attention(q, k, v, bias=bias)
    assert out.tolist() == [[2.0]]  # key 0: score + finfo.min overflows to -inf, weight 0


# ---------------------------------------------------------------- found by a sweep of bad arguments


def test_an_error_about_an_array_stays_on_one_line():
    q = np.ones((3, 4))
    with pytest.raises(AttnlabError) as info:
        attnlab.scaled_dot_product_attention(q, q, q, return_weights=np.ones((4, 4)))
    assert str(info.value) == ("return_weights: expected True or False, got ndarray of shape "
                               "(4, 4) and dtype float64")
    with pytest.raises(AttnlabError) as info:
        at.scaled_dot_product_attention(torch.ones(3, 4), torch.ones(3, 4), torch.ones(3, 4),
                                        scale=torch.ones(3, 3, requires_grad=True))
    assert "\n" not in str(info.value)
    assert "\n" not in str(AttnlabError("x: got array([[1],\n       [2]])"))


@pytest.mark.parametrize("call,name", [
    (lambda: attnlab.apply_rope(np.ones((2, 4)), positions=[[0, 1], [2]]), "positions"),
    (lambda: attnlab.apply_rope(np.ones((2, 4)), positions=torch.ones(2, requires_grad=True)),
     "positions"),
    (lambda: attnlab.sliding_window_mask(4, 3, is_causal=True, global_tokens=[[0], [1, 2]]),
     "global_tokens"),
    (lambda: attnlab.TinyDecoder(attnlab.DecoderConfig(vocab_size=16, d_model=8, num_heads=2))
     .generate([[1, 2], [3]], 2), "prompt_ids"),
    (lambda: at.apply_rope(torch.ones(2, 4), positions="01"), "positions"),
    (lambda: at.apply_rope(torch.ones(2, 4), positions=[[0, 1], [2]]), "positions"),
    (lambda: at.rope_angles(object(), 4), "positions"),
    (lambda: attnlab.mask_to_bias(np.ones(2, bool), dtype=torch.ones(2)), "dtype"),
    (lambda: attnlab.alibi_bias(2, 3, dtype="\udce9"), "dtype"),
    (lambda: attnlab.KVCache(1, 1, 4, dtype=torch.float32), "dtype"),
], ids=["rope-ragged", "rope-grad", "global-ragged", "ids-ragged", "t-rope-str",
        "t-rope-ragged", "t-angles-object", "bias-dtype-tensor", "alibi-dtype-surrogate",
        "cache-torch-dtype"])
def test_unreadable_arguments_are_named(call, name):
    with pytest.raises(AttnlabError, match=rf"^{name}: "):
        call()


@pytest.mark.parametrize("call,message", [
    (lambda: attnlab.block_sparse_attention(*[np.ones((2, 3, 4))] * 3, 10**12),
     r"block_size: the rows padded to whole blocks"),
    (lambda: attnlab.token_embeddings(["a", "b"], 10**12), r"d_model: the embeddings \(T, E\)"),
    (lambda: attnlab.positional.rope_angles(np.arange(3), 10**12),
     r"head_dim: the angles \(T, D\)"),
    (lambda: at.rope_angles(torch.arange(3), 10**12), r"head_dim: the angles \(T, D\)"),
    (lambda: at.MultiHeadAttention(2, 10**6), r"h, d_model: the weight of q_proj"),
])
def test_more_huge_sizes_are_refused_before_allocating(call, message):
    with pytest.raises(AttnlabError, match=rf"^{message}.*{LIMIT}"):
        call()


@pytest.mark.parametrize("flag", [True, np.bool_(False)])
def test_sliding_window_takes_a_0d_key_padding(flag):
    x = np.random.default_rng(0).standard_normal((2, 5, 4))
    out = attnlab.sliding_window_attention(x, x, x, 3, is_causal=True, key_padding=flag)
    plain = attnlab.scaled_dot_product_attention(
        x, x, x, attnlab.sliding_window_mask(5, 3, is_causal=True) & flag)
    np.testing.assert_allclose(out, plain, rtol=1e-12, atol=1e-12)  # float64, chunked vs plain


def test_converting_a_meta_module_to_numpy_is_refused_by_name():
    with pytest.raises(AttnlabError, match=r"^module: expected parameters holding values, got "
                                           r"parameters on the meta device"):
        at.to_numpy(at.MultiHeadAttention(2, 8, device="meta"))
