"""Conformance with Hugging Face transformers' attention masks.

The reference is transformers itself where it runs offline on CPU: the mask
functions and builders of ``transformers.masking_utils`` (``sdpa_mask`` and
``create_*_mask``: bool, True = attend; ``eager_mask``: 0 or
``torch.finfo(dtype).min``) and Llama's ``eager_attention_forward`` (scores +
the additive mask, softmax in float32). The pre-5.x ``AttentionMaskConverter``
of ``modeling_attn_mask_utils.py`` is gone from transformers 5; its semantics
(``_make_causal_mask``, ``_expand_mask``, ``to_4d``) are re-implemented in
NumPy below (``old_causal_4d``, ``old_to_4d``). Each test names the
transformers test it mirrors (huggingface/transformers:<path>::<name>).

Convention map (transformers -> attnlab):

- ``attention_mask`` 2-D (B, S), 1 = real token -> ``attnlab.padding_mask``
  (B, 1, 1, S), True = may attend.
- causal masks: key j allowed for the query at absolute position p (its
  cache position, past_key_values_length + i) when j <= p. With the keys at
  0 .. S-1 that is attnlab's bottom-right ``causal_mask(T, S)``.
- sliding window, transformers 5 (``sliding_window_overlay``): kv > p - W,
  i.e. W keys including the query itself: attnlab's ``sliding_window_mask(T, W,
  causal=True, S=S)`` and ``SlidingWindowKVCache(window=W)``. The old
  converter's ``_make_causal_mask(sliding_window=W)`` kept keys j >= p - W,
  W + 1 keys: attnlab's window of W + 1.
- bidirectional sliding window (|p - kv| <= w): attnlab's symmetric window of
  W = 2w + 1 (``causal=False``).
- chunked attention (Llama 4, chunk C, counted from the first real token):
  attnlab's ``block_sparse_mask(n, C, layout=eye, is_causal=True)`` on the
  unpadded part of each sequence.
- packed sequences (position_ids restarting at 0): causal within each
  sequence: ``causal_mask(T) & (seq_id[:, None] == seq_id[None, :])``.
- eager masks are additive: attnlab's ``bias``. With finfo.min every blocked
  score is swamped; a row blocked entirely (a left-padding query) then
  becomes a uniform average over all keys, as in transformers' eager path,
  while attnlab's bool ``mask`` gives that row 0.

Tolerances: float64 to 1e-12; float32 against transformers' eager attention
(float32 matmuls and softmax) to 2e-6 relative to max(1, max|ref|).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LlamaConfig, MistralConfig
from transformers import masking_utils as mu
from transformers.models.llama.modeling_llama import eager_attention_forward

import attnlab
import attnlab.torch as at

from ._reference import assert_close, reference_attention

F64_TOL = 1e-12
F32_REL = 2e-6
HIDDEN, HEADS, HEAD_DIM = 16, 2, 8


def _config(kind="llama", attn="sdpa", **extra):
    cls = MistralConfig if kind == "mistral" else LlamaConfig
    cfg = cls(num_hidden_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS,
              num_key_value_heads=HEADS, intermediate_size=8, vocab_size=10, **extra)
    cfg._attn_implementation = attn
    return cfg


def _embeds(B, T, dtype=torch.float32):
    return torch.zeros(B, T, HIDDEN, dtype=dtype)


def _qkv(seed, B, T, S, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((B, HEADS, n, HEAD_DIM)).astype(dtype) for n in (T, S, S))


def hf_eager(q, k, v, additive_mask):
    """transformers' eager attention (Llama): -> (B, H, T, D) NumPy."""
    module = SimpleNamespace(num_key_value_groups=1, training=False)
    t = torch.from_numpy
    mask = None if additive_mask is None else t(np.ascontiguousarray(additive_mask))
    out, _ = eager_attention_forward(module, t(q), t(k), t(v), mask, scaling=HEAD_DIM ** -0.5)
    return np.swapaxes(out.numpy(), 1, 2)


def _f32_tol(ref):
    return F32_REL * max(1.0, float(np.max(np.abs(ref))))


def run_attnlab(impl, q, k, v, mask=None, bias=None, is_causal=False):
    if impl == "plain":
        return attnlab.scaled_dot_product_attention(q, k, v, mask, bias=bias, is_causal=is_causal)
    if impl == "flash":
        return attnlab.flash_attention(q, k, v, mask, bias=bias, is_causal=is_causal,
                                       block_q=2, block_k=2)
    t = torch.from_numpy
    return at.scaled_dot_product_attention(
        t(q), t(k), t(v), None if mask is None else t(np.ascontiguousarray(mask)),
        bias=None if bias is None else t(np.ascontiguousarray(bias)),
        is_causal=is_causal).numpy()


# ------------------------------------------------- the pre-5.x AttentionMaskConverter


def old_causal_4d(bsz, q_len, kv_len, dtype, sliding_window=None):
    """AttentionMaskConverter._make_causal_mask: 0 = attend, finfo.min = blocked."""
    past = kv_len - q_len
    fmin = np.finfo(dtype).min
    cond = np.arange(q_len)
    mask = np.where(cond[None, :] < (cond + 1)[:, None], 0.0, fmin).astype(dtype)
    if past > 0:
        mask = np.concatenate([np.zeros((q_len, past), dtype=dtype), mask], axis=-1)
    if sliding_window is not None:
        context = np.tril(np.ones(mask.shape, dtype=bool), k=past - sliding_window - 1)
        mask = np.where(context, fmin, mask).astype(dtype)
    return np.broadcast_to(mask, (bsz, 1, q_len, kv_len))


def old_to_4d(attention_mask_2d, q_len, kv_len, dtype, sliding_window=None):
    """AttentionMaskConverter(is_causal=True, sliding_window).to_4d: -> (B, 1, T, S) additive."""
    bsz = attention_mask_2d.shape[0]
    fmin = np.finfo(dtype).min
    inverted = 1.0 - np.broadcast_to(attention_mask_2d[:, None, None, :].astype(dtype),
                                     (bsz, 1, q_len, kv_len))
    expanded = np.where(inverted != 0, fmin, inverted).astype(dtype)
    if q_len > 1 or sliding_window is not None:
        causal = old_causal_4d(bsz, q_len, kv_len, dtype, sliding_window)
        expanded = np.where(expanded != 0, fmin, causal).astype(dtype)
    return expanded


# --------------------------------------------------------------------------------------
# huggingface/transformers:tests/utils/test_masking_utils.py::MaskTest::
#     test_packed_sequence_mask_sdpa, test_packed_sequence_mask_eager and
#     test_find_packed_sequence_indices
# Position ids [[0,1,2,3,0,1,0,1,2,3], [0,1,2,3,4,5,0,1,2,3]]: three packed sequences, then
# two. The sequence ids (a new one wherever a position does not follow the previous one)
# and attnlab's mask causal_mask(10) & same-sequence must be transformers' masks; the
# attention through them (bool as mask, eager finfo.min as bias) equals transformers'
# eager attention.

POSITION_IDS = np.array([[0, 1, 2, 3, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]])


@pytest.mark.parametrize("impl", ["plain", "flash", "torch"])
@pytest.mark.parametrize("kind", ["sdpa", "eager"])
def test_packed_sequence_mask(kind, impl):
    B, T = POSITION_IDS.shape
    starts = np.ones_like(POSITION_IDS, dtype=bool)
    starts[:, 1:] = POSITION_IDS[:, 1:] != POSITION_IDS[:, :-1] + 1
    seq_ids = np.cumsum(starts, axis=1) - 1
    found = mu.find_packed_sequence_indices(torch.from_numpy(POSITION_IDS))
    assert np.array_equal(found.numpy(), seq_ids)
    expected = attnlab.causal_mask(T) & (seq_ids[:, :, None] == seq_ids[:, None, :])
    expected = expected[:, None]  # (B, 1, T, T)
    hf_mask = mu.create_causal_mask(config=_config(attn=kind), inputs_embeds=_embeds(B, T),
                                    attention_mask=None, cache=None,
                                    position_ids=torch.from_numpy(POSITION_IDS)).numpy()
    eager_mask = np.where(expected, 0.0, np.finfo(np.float32).min).astype(np.float32)
    if kind == "sdpa":
        assert np.array_equal(hf_mask, expected)
    else:
        assert np.array_equal(hf_mask, eager_mask)
    q, k, v = _qkv(10, B, T, T)
    ref = hf_eager(q, k, v, eager_mask)
    out = (run_attnlab(impl, q, k, v, mask=hf_mask) if kind == "sdpa"
           else run_attnlab(impl, q, k, v, bias=hf_mask))
    assert_close(out, ref, atol=_f32_tol(ref), what=f"{impl} {kind}")


# --------------------------------------------------------------------------------------
# huggingface/transformers:tests/test_modeling_utils.py::AttentionMaskTester::
#     test_2d_to_4d_causal (q_len 1, 3, 7 against kv_len 7, with additional_mask
#     [(0, 2), (1, 3), (2, 0)] and the "does not overflow" case [(0, 0), (1, 0), (1, 1)]),
# and transformers 5's create_causal_mask with a DynamicCache holding the
# past_key_values_length = kv_len - q_len earlier tokens. Both must be attnlab's
# causal_mask(q_len, kv_len) & padding_mask(attention_mask) (the old one as 0 / finfo.min,
# never -inf); attention with the old additive mask as bias equals transformers' eager
# attention on every row, and with attnlab's bool mask on every row that has a key (the
# others: 0 in attnlab, a uniform average in eager).

ADDITIONAL_MASKS = {"none": [], "holes": [(0, 2), (1, 3), (2, 0)],
                    "no_overflow": [(0, 0), (1, 0), (1, 1)]}


@pytest.mark.parametrize("additional", list(ADDITIONAL_MASKS))
@pytest.mark.parametrize("q_len", [1, 3, 7])
def test_2d_to_4d_causal(q_len, additional):
    B, kv_len = 3, 7
    am = np.ones((B, kv_len), dtype=np.int64)
    for b, j in ADDITIONAL_MASKS[additional]:
        am[b, j] = 0
    expected = attnlab.causal_mask(q_len, kv_len) & attnlab.padding_mask(am)  # (B, 1, T, S)
    old = old_to_4d(am, q_len, kv_len, np.float32)
    assert np.array_equal(old, np.where(expected, 0.0, np.finfo(np.float32).min))
    assert np.isfinite(old).all()  # finfo.min, not -inf: no overflow
    past = kv_len - q_len
    cache = None
    if past:
        cache = DynamicCache(config=_config())
        fake = torch.zeros(B, HEADS, past, HEAD_DIM)
        cache.update(fake, fake, 0)
    new = mu.create_causal_mask(config=_config(), inputs_embeds=_embeds(B, q_len),
                                attention_mask=torch.from_numpy(am), cache=cache,
                                allow_is_causal_skip=False)
    assert np.array_equal(new.numpy(), np.broadcast_to(expected, new.shape))
    q, k, v = _qkv(q_len * 10 + len(additional), B, q_len, kv_len)
    ref = hf_eager(q, k, v, old)
    tol = _f32_tol(ref)
    assert_close(attnlab.scaled_dot_product_attention(q, k, v, bias=old), ref, atol=tol,
                 what="bias = old 4-D mask")
    live = np.broadcast_to(expected.any(-1, keepdims=True), (B, HEADS, q_len, 1))
    out = attnlab.scaled_dot_product_attention(q, k, v, expected)
    assert_close(np.where(live, out, ref), ref, atol=tol, what="bool mask, live rows")
    assert np.all(np.where(live, 0.0, out) == 0)


# --------------------------------------------------------------------------------------
# huggingface/transformers:tests/utils/test_masking_utils.py (sdpa_mask with
# sliding_window_causal_mask_function, its docstring's sliding_window=3 example, and
# create_sliding_window_causal_mask): the window of W keys ending at the query itself,
# with past tokens (q_offset = past_key_values_length), is attnlab's
# sliding_window_mask(T, W, is_causal=True, S=S) and attnlab.torch's sliding_window_mask.

@pytest.mark.parametrize("T,past", [(6, 0), (1, 9), (4, 5)])
@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_sliding_window_mask_new_convention(window, T, past):
    S = past + T
    hf = mu.sdpa_mask(batch_size=1, q_length=T, kv_length=S, q_offset=past,
                      mask_function=mu.sliding_window_causal_mask_function(window),
                      allow_is_causal_skip=False)[0, 0].numpy()
    ours = attnlab.sliding_window_mask(T, window, is_causal=True, S=S)
    assert np.array_equal(hf, ours)
    assert np.array_equal(at.sliding_window_mask(T, window, is_causal=True, S=S).numpy(), hf)
    assert int(hf[-1].sum()) == min(window, S)  # W keys, the query itself included
    if past == 0:
        built = mu.create_sliding_window_causal_mask(
            config=_config("mistral", sliding_window=window), inputs_embeds=_embeds(1, T),
            attention_mask=None, cache=None, allow_is_causal_skip=False)
        assert np.array_equal(built[0, 0].numpy(), ours)


# huggingface/transformers:tests/test_modeling_utils.py::AttentionMaskTester::
#     test_causal_mask_sliding and test_2d_to_4d_causal_sliding (sliding_window=5, q_len 1,
#     3, 7 against kv_len 7; also sliding_window=2). The old converter keeps j >= p - W:
# W + 1 keys, attnlab's window of W + 1, and one key more than attnlab's (and transformers
# 5's) window of W wherever the window is shorter than the history.

@pytest.mark.parametrize("q_len", [1, 3, 7])
@pytest.mark.parametrize("window", [5, 2])
def test_sliding_window_mask_old_convention(window, q_len):
    kv_len = 7
    old = old_causal_4d(1, q_len, kv_len, np.float32, sliding_window=window)[0, 0] == 0
    assert np.array_equal(old, attnlab.sliding_window_mask(q_len, window + 1, is_causal=True,
                                                           S=kv_len))
    new = attnlab.sliding_window_mask(q_len, window, is_causal=True, S=kv_len)
    assert int(old[-1].sum()) == int(new[-1].sum()) + 1  # the last query: one key more
    am = np.ones((2, kv_len), dtype=np.int64)
    am[1, 0] = 0
    to4d = old_to_4d(am, q_len, kv_len, np.float32, sliding_window=window) == 0
    assert np.array_equal(to4d, old & attnlab.padding_mask(am))


# huggingface/transformers:tests/utils/test_masking_utils.py::MaskTest::
#     test_chunked_mask_with_left_padding_decoding, for the sliding-window layer instead of
#     the chunked one: a DynamicCache on a sliding-window config keeps the last W - 1
# tokens; decoding T more, transformers' mask over those kept keys is attnlab's window
# sliding_window_mask(T, W, S=past + T) restricted to them, and transformers' eager
# attention over its cache equals attnlab's SlidingWindowKVCache(window=W).

@pytest.mark.parametrize("impl", ["numpy", "torch"])
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("window", [2, 3, 5])
def test_sliding_window_cache_decoding(window, T, impl):
    B, past = 1, 7
    q, k, v = _qkv(window * 10 + T, B, past + T, past + T)
    cfg = _config("mistral", attn="eager", sliding_window=window)
    cache = DynamicCache(config=cfg)
    cache.update(torch.from_numpy(k[:, :, :past]), torch.from_numpy(v[:, :, :past]), 0)
    hf_mask = mu.create_sliding_window_causal_mask(
        config=cfg, inputs_embeds=_embeds(B, T), attention_mask=None, cache=cache).numpy()
    keys, values = cache.update(torch.from_numpy(k[:, :, past:]),
                                torch.from_numpy(v[:, :, past:]), 0)
    kept = keys.shape[2]
    assert np.array_equal(keys.numpy(), k[:, :, past + T - kept:])  # the last tokens
    ours = attnlab.sliding_window_mask(T, window, is_causal=True, S=past + T)[:, -kept:]
    assert np.array_equal(hf_mask[0, 0] == 0, ours)
    ref = hf_eager(q[:, :, past:], keys.numpy(), values.numpy(), hf_mask)
    if impl == "numpy":
        swc = attnlab.SlidingWindowKVCache(B, HEADS, HEAD_DIM, window=window, dtype=np.float32)
        swc.attend(q[:, :, :past], k[:, :, :past], v[:, :, :past])
        out = swc.attend(q[:, :, past:], k[:, :, past:], v[:, :, past:])
    else:
        swc = at.SlidingWindowKVCache(B, HEADS, HEAD_DIM, window=window)
        t = torch.from_numpy
        swc.attend(t(q[:, :, :past].copy()), t(k[:, :, :past].copy()), t(v[:, :, :past].copy()))
        out = swc.attend(t(q[:, :, past:].copy()), t(k[:, :, past:].copy()),
                         t(v[:, :, past:].copy())).numpy()
    assert_close(out, ref, atol=_f32_tol(ref), what=impl)


# --------------------------------------------------------------------------------------
# huggingface/transformers:tests/utils/test_masking_utils.py::MaskTest::
#     test_chunked_mask_with_left_padding_and_large_prefill
# attention_chunk_size C, 8 tokens, the first sequence left-padded by 4: chunks count from
# the first real token. attnlab: block_sparse_mask(n, C, layout=eye, is_causal=True) on the
# unpadded part of each sequence; block_sparse_attention on the unpadded sequence equals
# transformers' eager attention through its chunked mask.

@pytest.mark.parametrize("chunk", [2, 3, 4])
def test_chunked_mask_with_left_padding(chunk):
    B, T, pad = 2, 8, 4
    am = np.ones((B, T), dtype=np.int64)
    am[0, :pad] = 0
    cfg = _config(attention_chunk_size=chunk)
    hf = mu.create_chunked_causal_mask(config=cfg, inputs_embeds=_embeds(B, T),
                                       attention_mask=torch.from_numpy(am), cache=None,
                                       allow_is_causal_skip=False).numpy()[:, 0]
    for b, p in ((0, pad), (1, 0)):
        n = T - p
        blocks = -(-n // chunk)
        ours = np.zeros((T, T), dtype=bool)
        ours[p:, p:] = attnlab.block_sparse_mask(n, chunk, layout=np.eye(blocks, dtype=bool),
                                                 is_causal=True)
        assert np.array_equal(hf[b], ours)
    cfg_eager = _config(attn="eager", attention_chunk_size=chunk)
    eager = mu.create_chunked_causal_mask(config=cfg_eager, inputs_embeds=_embeds(1, T),
                                          attention_mask=None, cache=None).numpy()
    q, k, v = _qkv(chunk, 1, T, T)
    ref = hf_eager(q, k, v, eager)
    out = attnlab.block_sparse_attention(q, k, v, chunk, layout=np.eye(-(-T // chunk),
                                                                       dtype=bool), is_causal=True)
    assert_close(out, ref, atol=_f32_tol(ref), what="block_sparse_attention")


# huggingface/transformers:src/transformers/masking_utils.py::
#     sliding_window_bidirectional_mask_function (create_bidirectional_sliding_window_mask;
#     its tests live in the encoder models' suites): |p - kv| <= w is attnlab's symmetric
# window of W = 2w + 1; sliding_window_attention equals transformers' eager attention.

@pytest.mark.parametrize("w", [0, 1, 2, 4])
def test_bidirectional_sliding_window(w):
    T = 9
    hf = mu.sdpa_mask(batch_size=1, q_length=T, kv_length=T,
                      mask_function=mu.sliding_window_bidirectional_mask_function(w),
                      allow_is_causal_skip=False)[0, 0].numpy()
    assert np.array_equal(hf, attnlab.sliding_window_mask(T, 2 * w + 1, is_causal=False))
    eager = mu.eager_mask(batch_size=1, q_length=T, kv_length=T,
                          mask_function=mu.sliding_window_bidirectional_mask_function(w),
                          dtype=torch.float32).numpy()
    q, k, v = _qkv(w, 1, T, T)
    ref = hf_eager(q, k, v, eager)
    out = attnlab.sliding_window_attention(q, k, v, 2 * w + 1, is_causal=False)
    assert_close(out, ref, atol=_f32_tol(ref), what="sliding_window_attention")


# --------------------------------------------------------------------------------------
# huggingface/transformers:tests/utils/test_masking_utils.py (create_causal_mask with a
# left-padded attention_mask, sdpa and eager) and tests/test_modeling_utils.py::
#     AttentionMaskTester::test_unmask_unattended_left_padding (the left-padding rows that
# see nothing). Five padding tokens, longer than flash's tile of 2. transformers' bool mask
# is attnlab's causal_mask & padding_mask; its eager mask (finfo(dtype).min) given to
# attnlab as bias reproduces eager attention on every row, the padding rows being uniform
# averages of all values; with the bool mask those rows are 0 instead. float32 against
# transformers' eager attention; float64 against the float64 reference (transformers'
# eager softmax runs in float32).

@pytest.mark.parametrize("impl", ["plain", "flash", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_left_padding_finfo_min(dtype, impl):
    B, T, pad = 2, 12, 5
    am = np.ones((B, T), dtype=np.int64)
    am[0, :pad] = 0
    tdtype = torch.float32 if dtype == np.float32 else torch.float64
    sdpa = mu.create_causal_mask(config=_config(), inputs_embeds=_embeds(B, T, tdtype),
                                 attention_mask=torch.from_numpy(am), cache=None).numpy()
    eager = mu.create_causal_mask(config=_config(attn="eager"), inputs_embeds=_embeds(B, T, tdtype),
                                  attention_mask=torch.from_numpy(am), cache=None).numpy()
    expected = attnlab.causal_mask(T) & attnlab.padding_mask(am)
    assert np.array_equal(sdpa, np.broadcast_to(expected, sdpa.shape))
    assert eager.dtype == dtype and eager.min() == np.finfo(dtype).min
    assert np.array_equal(eager == 0, sdpa)
    q, k, v = _qkv(int(dtype == np.float64), B, T, T, dtype)
    if dtype == np.float32:
        ref = hf_eager(q, k, v, eager)
        tol = _f32_tol(ref)
    else:
        ref, _, _ = reference_attention(q, k, v, bias=eager)
        tol = F64_TOL
    dead = ~expected.any(-1)[0, 0]  # batch item 0: the padding queries see nothing
    assert dead.sum() == pad
    uniform = v[0].mean(axis=-2)  # (H, D): every value weighted 1 / T, computed by hand
    assert_close(ref[0][:, dead], np.broadcast_to(uniform[:, None], ref[0][:, dead].shape),
                 atol=tol, what="the reference's padding rows are uniform averages")
    out_bias = run_attnlab(impl, q, k, v, bias=eager)
    assert_close(out_bias, ref, atol=tol, what="bias = eager mask")
    out_mask = run_attnlab(impl, q, k, v, mask=sdpa)
    assert np.all(out_mask[0][:, dead] == 0)
    live = np.ones_like(out_mask, dtype=bool)
    live[0][:, dead] = False
    assert_close(out_mask[live], ref[live], atol=tol, what="bool mask, live rows")
