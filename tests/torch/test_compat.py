"""attnlab.torch.compat against torch itself: nn.MultiheadAttention, the Transformer
layers it drops into, and F.scaled_dot_product_attention.

Tolerances: float64 compares to 1e-12 (the same math, sums in another order);
float32 layers to 1e-6 absolute on outputs of size ~1 (LayerNorm'd), the float32
rounding of a few hundred-term dot products done in another order.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import attnlab.torch as at
from attnlab import AttnlabError
from attnlab.torch import compat

TOL64 = {"rtol": 1e-12, "atol": 1e-12}
TOL32 = {"rtol": 0.0, "atol": 1e-6}

OPTIONS = [
    {},
    {"bias": False},
    {"add_bias_kv": True},
    {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True},
    {"kdim": 5, "vdim": 3},
]


def pair(batch_first: bool, dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(8, 2, batch_first=batch_first, dtype=dtype, **kwargs)
    with torch.no_grad():  # non-zero biases, so that a misplaced one shows
        for name, p in theirs.named_parameters():
            if "bias" in name:
                p.normal_(0.0, 0.2)
    ours = compat.MultiheadAttention(8, 2, batch_first=batch_first, dtype=dtype, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "plain")
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_matches_torch_with_every_mask(options, batch_first):
    theirs, ours = pair(batch_first, **options)
    B, T, S = 3, 4, 5
    q = torch.randn(B, T, 8, dtype=torch.float64)
    k = torch.randn(B, S, options.get("kdim", 8), dtype=torch.float64)
    v = torch.randn(B, S, options.get("vdim", 8), dtype=torch.float64)
    if not batch_first:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[1, 3:] = True  # True = padding, torch's meaning
    blocked = torch.rand(T, S, generator=torch.Generator().manual_seed(1)) < 0.3
    blocked[:, 0] = False  # torch gives NaN for a row with nothing to attend to
    calls = [
        {},
        {"key_padding_mask": padding},
        {"attn_mask": blocked},
        {"attn_mask": blocked.repeat(B * 2, 1, 1)},  # (B*H, T, S)
        {"attn_mask": torch.where(blocked, -1e9, 0.0).double(),  # float masks are added
         "key_padding_mask": torch.where(padding, float("-inf"), 0.0).double()},
        {"attn_mask": torch.randn(T, S, dtype=torch.float64), "need_weights": False},
    ]
    for kwargs in calls:
        for average in (True, False):
            ref, ref_w = theirs(q, k, v, average_attn_weights=average, **kwargs)
            out, w = ours(q, k, v, average_attn_weights=average, **kwargs)
            torch.testing.assert_close(out, ref, **TOL64)
            if ref_w is None:
                assert w is None
            else:
                torch.testing.assert_close(w, ref_w, **TOL64)


def test_unbatched_inputs_and_3d_masks():
    theirs, ours = pair(False)
    x = torch.randn(4, 8, dtype=torch.float64)  # (T, E)
    blocked = torch.rand(2, 4, 4, generator=torch.Generator().manual_seed(2)) < 0.3  # (H, T, S)
    blocked[..., 0] = False
    padding = torch.tensor([False, False, False, True])
    ref, ref_w = theirs(x, x, x, key_padding_mask=padding, attn_mask=blocked)
    out, w = ours(x, x, x, key_padding_mask=padding, attn_mask=blocked)
    torch.testing.assert_close(out, ref, **TOL64)
    torch.testing.assert_close(w, ref_w, **TOL64)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "plain")
def test_state_dict_moves_both_ways(options):
    theirs, ours = pair(True, **options)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    fresh = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64, **options)
    fresh.load_state_dict(ours.state_dict())
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    k = torch.randn(2, 3, options.get("kdim", 8), dtype=torch.float64)
    v = torch.randn(2, 3, options.get("vdim", 8), dtype=torch.float64)
    torch.testing.assert_close(fresh(x, k, v)[0], ours(x, k, v)[0], **TOL64)
    copy = compat.MultiheadAttention.from_torch(theirs)
    torch.testing.assert_close(copy(x, k, v)[0], theirs(x, k, v)[0], **TOL64)


def test_gradients_match_torch():
    theirs, ours = pair(True, add_bias_kv=True)
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    padding = torch.tensor([[False] * 4, [False, False, True, True]])
    for module in (theirs, ours):
        out, _ = module(x, x, x, key_padding_mask=padding, need_weights=False)
        out.pow(2).sum().backward()
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, **TOL64, msg=name)


def test_attnlab_extras_stay_reachable():
    theirs, ours = pair(True)
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    blocked = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    native = ours.to_attnlab()  # attnlab's conventions: True = may attend, keyword-only
    out, per_head = native(x, x, x, mask=~blocked, return_weights=True)
    ref, ref_w = theirs(x, x, x, attn_mask=blocked, average_attn_weights=False)
    torch.testing.assert_close(out, ref, **TOL64)
    torch.testing.assert_close(per_head, ref_w, **TOL64)
    with at.debug_checks(), pytest.raises(AttnlabError, match="query"):
        ours(x * float("nan"), x, x)


# ----------------------------------------------------------------------- Transformer layers


def _layers(kind: str, batch_first: bool, norm_first: bool):
    torch.manual_seed(3)
    cls = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    stock = cls(32, 4, dim_feedforward=64, dropout=0.0, batch_first=batch_first,
                norm_first=norm_first)
    ours = compat.use_attnlab(cls(32, 4, dim_feedforward=64, dropout=0.0,
                                  batch_first=batch_first, norm_first=norm_first))
    ours.load_state_dict(stock.state_dict())
    assert isinstance(ours.self_attn, compat.MultiheadAttention)
    return stock, ours


def _layer_inputs(kind: str, batch_first: bool, masks: str):
    B, T, S = 3, 6, 5
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(B, T, 32, generator=gen)
    memory = torch.randn(B, S, 32, generator=gen)
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, 4:] = True
    memory_padding = torch.zeros(B, S, dtype=torch.bool)
    memory_padding[2, 3:] = True
    if not batch_first:
        x, memory = x.transpose(0, 1), memory.transpose(0, 1)
    causal = nn.Transformer.generate_square_subsequent_mask(T)  # float, -inf above
    kwargs: dict = {}
    if kind == "encoder":
        if masks in ("padding", "both"):
            kwargs["src_key_padding_mask"] = padding
        if masks in ("mask", "both"):
            kwargs["src_mask"] = causal if masks == "mask" else causal.isinf()
            kwargs["is_causal"] = True
        return (x,), kwargs
    if masks in ("padding", "both"):
        kwargs.update(tgt_key_padding_mask=padding, memory_key_padding_mask=memory_padding)
    if masks in ("mask", "both"):
        kwargs.update(tgt_mask=causal, tgt_is_causal=True)
    return (x, memory), kwargs


@pytest.mark.parametrize("masks", ["none", "padding", "mask", "both"])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_drops_into_transformer_layers(kind, batch_first, norm_first, masks):
    stock, ours = _layers(kind, batch_first, norm_first)
    args, kwargs = _layer_inputs(kind, batch_first, masks)
    # train mode: the layers call self_attn; gradients too
    leaves = [[a.clone().requires_grad_() for a in args] for _ in range(2)]
    ref = stock.train()(*leaves[0], **kwargs)
    out = ours.train()(*leaves[1], **kwargs)
    torch.testing.assert_close(out, ref, **TOL32)
    ref.pow(2).sum().backward()
    out.pow(2).sum().backward()
    for (name, p), q in zip(stock.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5, msg=name)
    # eval with autograd on (the layers' slow path, calling self_attn) and under
    # inference mode (the encoder's fused fast path where torch allows it)
    stock.eval(), ours.eval()
    torch.testing.assert_close(ours(*args, **kwargs), stock(*args, **kwargs), **TOL32)
    with torch.inference_mode():
        torch.testing.assert_close(ours(*args, **kwargs), stock(*args, **kwargs), **TOL32)


def test_whole_encoder_with_nested_tensor_fast_path():
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True)
    stock = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    ours = compat.use_attnlab(nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)).eval()
    ours.load_state_dict(stock.state_dict())
    x = torch.randn(3, 6, 32)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = True
    for mode in (torch.no_grad, torch.enable_grad):
        with mode():
            torch.testing.assert_close(ours(x, src_key_padding_mask=padding),
                                       stock(x, src_key_padding_mask=padding), **TOL32)


# ----------------------------------------------------------------------- sdpa


@pytest.mark.parametrize("T, S", [(3, 7), (7, 3), (5, 5)])
def test_sdpa_is_causal_is_top_left_like_torch(T, S):
    """The 4th silent mismatch: attnlab's is_causal is bottom-right (right for decoding),
    torch's top-left; compat's is torch's, and the two differ whenever T != S."""
    gen = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for n in (T, S, S))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(compat.scaled_dot_product_attention(q, k, v, is_causal=True),
                               ref, **TOL64)
    ours = at.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(ours, ref) == (T == S)


@pytest.mark.parametrize("H, Hkv", [(4, 2), (6, 1), (4, 4)])
def test_sdpa_matches_torch(H, Hkv):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(2, H, 5, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, Hkv, 6, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, Hkv, 6, 4, generator=gen, dtype=torch.float64)
    allowed = torch.rand(5, 6, generator=gen) < 0.6  # True = may attend, torch's bool meaning
    allowed[2] = False  # a row with nothing to attend to: 0 in both
    float_mask = torch.randn(H, 5, 6, generator=gen, dtype=torch.float64)
    for kwargs in ({}, {"attn_mask": allowed}, {"attn_mask": float_mask}, {"scale": 0.3},
                   {"is_causal": True}):
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        out = compat.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
        torch.testing.assert_close(out, ref, **TOL64)


def test_sdpa_dropout_draws_as_torch_does():
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    torch.manual_seed(8)
    ref = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(8)
    out = compat.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.testing.assert_close(out, ref, **TOL32)


def test_signatures_are_torchs():
    import inspect

    # F.scaled_dot_product_attention is a builtin: its signature is the docstring's first line.
    doc = F.scaled_dot_product_attention.__doc__
    documented = " ".join(doc[: doc.index(")") + 1].split())  # over several lines
    ours_sdpa = inspect.signature(compat.scaled_dot_product_attention).parameters.values()
    listed = ", ".join(f"{p.name}={p.default}" if p.default is not p.empty else p.name
                       for p in ours_sdpa)
    assert documented == f"scaled_dot_product_attention({listed})", documented
    ours = inspect.signature(compat.MultiheadAttention.forward).parameters
    theirs = inspect.signature(nn.MultiheadAttention.forward).parameters
    assert [(p.name, p.default) for p in ours.values()] == \
        [(p.name, p.default) for p in theirs.values()]


@pytest.mark.parametrize("call, match", [
    (lambda q: compat.scaled_dot_product_attention(
        q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool), is_causal=True),
     "attn_mask: expected None with is_causal=True"),
    (lambda q: compat.scaled_dot_product_attention(q, q[:, :3], q[:, :3], enable_gqa=True),
     "k: expected a number of key/value heads Hkv that divides q's H = 4"),
    (lambda q: compat.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4).int()),
     "attn_mask: expected a bool or float tensor"),
    (lambda q: compat.MultiheadAttention(8, 2)(q[0], q[0], q[0], is_causal=True),
     "attn_mask: expected the causal mask with is_causal=True"),
    (lambda q: compat.MultiheadAttention(8, 2)(q[0], q[0], q[0],
                                               key_padding_mask=torch.ones(2, 3).bool()),
     r"key_padding_mask: expected \(4, 4\)"),
    (lambda q: compat.MultiheadAttention(8, 2)(q[0], q[0], q[0],
                                               attn_mask=torch.ones(3, 4).bool()),
     r"attn_mask: expected \(4, 4\) or \(8, 4, 4\)"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises(AttnlabError, match=match):
        call(torch.randn(2, 4, 4, 8))


# ----------------------------------------------- torch's own cases (NestedTensor, seeds,
# dtypes, the global swap): the stock torch module is the reference


def test_nested_tensor_encoder_with_a_hook_on_self_attn():
    """A forward hook on self_attn turns the layers' fused path off, so the encoder's
    NestedTensor (enable_nested_tensor=True, eval, no_grad, a padding mask) reaches
    MultiheadAttention.forward itself. Same numbers as the stock encoder: float32
    rounding of two different summation orders (1e-6)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    stock = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    ours = compat.use_attnlab(nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)).eval()
    ours.load_state_dict(stock.state_dict())
    nested_inputs: list[bool] = []
    for model in (stock, ours):
        for block in model.layers:
            block.self_attn.register_forward_hook(
                lambda module, args, out: nested_inputs.append(args[0].is_nested))
    x = torch.randn(3, 5, 8)
    padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    with torch.no_grad():
        expected = stock(x, src_key_padding_mask=padding)
        got = ours(x, src_key_padding_mask=padding)
    assert all(nested_inputs) and len(nested_inputs) == 4  # the case asked for was run
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("average", [True, False])
def test_nested_tensor_inputs_give_torchs_outputs_and_padded_weights(average):
    torch.manual_seed(1)
    stock = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    ours = compat.MultiheadAttention.from_torch(stock)
    x = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)])
    with torch.no_grad():
        out, weights = stock(x, x, x, average_attn_weights=average)
        got, got_weights = ours(x, x, x, average_attn_weights=average)
    assert got.is_nested
    for a, b in zip(got.unbind(), out.unbind(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)  # float32 rounding
    torch.testing.assert_close(got_weights, weights, atol=1e-6, rtol=1e-6)
    with pytest.raises(AttnlabError, match="key_padding_mask: expected None with NestedTensor"):
        ours(x, x, x, key_padding_mask=torch.zeros(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_seeded_dropout_gives_torchs_numbers(kind, batch_first):
    """Train mode, dropout 0.1, the same seed: the same numbers as the stock layer. The
    layers' dropout1 draws its mask in memory order, so the output must be laid out as
    torch lays it out ((T, B, E) in memory). Both draw the same bits, so only float32
    rounding differs (1e-6)."""
    torch.manual_seed(0)
    if kind == "encoder":
        stock = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.1,
                                           batch_first=batch_first)
    else:
        stock = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.1,
                                           batch_first=batch_first)
    ours = compat.use_attnlab(copy.deepcopy(stock))
    stock.train(), ours.train()
    x = torch.randn(2, 4, 8) if batch_first else torch.randn(4, 2, 8)
    args = (x,) if kind == "encoder" else (x, torch.randn_like(x))
    torch.manual_seed(42)
    expected = stock(*args)
    torch.manual_seed(42)
    got = ours(*args)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_output_layout_is_torchs():
    for batch_first in (True, False):
        stock = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        ours = compat.MultiheadAttention.from_torch(stock)
        x = torch.randn(2, 3, 8)
        assert ours(x, x, x)[0].stride() == stock(x, x, x)[0].stride()


def test_dtypes_as_torch():
    q = torch.randn(1, 2, 3, 4)
    k = torch.randn(1, 2, 3, 4, dtype=torch.float16)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, k)  # torch refuses: so do we, by name
    with pytest.raises(AttnlabError, match="query, key, value: expected the same dtype"):
        compat.scaled_dot_product_attention(q, k, k)
    # A float64 module whose in_proj_bias is float16: torch computes (the bias in the
    # weights' dtype); so do we. float64 throughout, so 1e-12.
    torch.manual_seed(2)
    stock = nn.MultiheadAttention(8, 2, batch_first=True).double().eval()
    ours = compat.MultiheadAttention(8, 2, batch_first=True).double().eval()
    ours.load_state_dict(stock.state_dict())
    for module in (stock, ours):
        module.in_proj_bias.data = module.in_proj_bias.data.half()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with torch.no_grad():
        expected, expected_weights = stock(x, x, x)
        got, got_weights = ours(x, x, x)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got_weights, expected_weights, atol=1e-12, rtol=1e-12)


def test_the_global_swap_of_torchs_sdpa_does_not_recurse(monkeypatch):
    """``F.scaled_dot_product_attention = compat.scaled_dot_product_attention`` routes
    torch's own modules through attnlab; attnlab must still reach torch's kernel."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 5, 4) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    expected_mha = mha(x, x, x, need_weights=False)[0]
    monkeypatch.setattr(F, "scaled_dot_product_attention", compat.scaled_dot_product_attention)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(compat.scaled_dot_product_attention(q, k, v, is_causal=True),
                               expected_causal, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(mha(x, x, x, need_weights=False)[0], expected_mha,
                               atol=1e-6, rtol=1e-6)
