"""attnlab.torch in the places real models put it: torch.compile, autocast, vmap,
meta / fake tensors, torch.export, and a per-call fast path that must equal the
checked one.

References are torch's own (F.scaled_dot_product_attention, nn.MultiheadAttention,
eager mode); tolerances are written where results are not bitwise equal.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnlab.torch as at
from attnlab.errors import AttnlabError
from attnlab.torch.convert import from_torch_multihead
from attnlab.torch.kernel import CPU_FUSED_ZEROES_EMPTY_ROWS


def qkv(B: int = 2, H: int = 3, T: int = 5, S: int = 7, D: int = 8,
        dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (T, S, S))


# ------------------------------------------------------------- the fast path


def test_installed_torch_zeroes_empty_rows_as_attnlab_assumes():
    """attend skips its own fix-up for rows with nothing to attend to on CPU when
    CPU_FUSED_ZEROES_EMPTY_ROWS; this is the check that the installed torch does so."""
    q, k, v = (t.requires_grad_() for t in qkv())
    mask = torch.ones(5, 7, dtype=torch.bool)
    mask[2] = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    if CPU_FUSED_ZEROES_EMPTY_ROWS:
        assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
        assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))
    # Either way attnlab's answer is 0, output and gradient.
    q.grad = None
    out = at.scaled_dot_product_attention(q, k, v, mask)
    out.sum().backward()
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert torch.equal(q.grad[:, :, 2], torch.zeros_like(q.grad[:, :, 2]))


MASKS = {
    "none": None,
    "(T, S)": torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3,
    "(B, 1, T, S)": torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(2)) > 0.3,
    "(1, S) key padding": torch.tensor([[True] * 5 + [False] * 2]),
    "(B, H, T, S) with an empty row": torch.ones(2, 3, 5, 7, dtype=torch.bool).index_fill(
        2, torch.tensor([1]), False),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("name", list(MASKS))
def test_fast_path_equals_the_checked_path(name, dtype):
    q, k, v = qkv(dtype=dtype)
    mask = MASKS[name]
    fast = at.scaled_dot_product_attention(q, k, v, mask)
    # An explicit scale (the same 1/sqrt(D)) takes the checked path: the same fused call.
    checked = at.scaled_dot_product_attention(q, k, v, mask, scale=1 / math.sqrt(8))
    assert torch.equal(fast, checked)
    # And the plain path (weights asked for), op for op the NumPy core's: float64 to
    # 1e-12, float32 to 1e-6 (different summation order in the fused kernel), bfloat16 to
    # its 8-bit mantissa (the plain path computes in float32 and rounds once).
    plain, _ = at.scaled_dot_product_attention(q, k, v, mask, return_weights=True)
    tol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(fast, plain, atol=tol, rtol=tol)


def test_fast_path_causal_equals_an_explicit_mask():
    q, k, v = qkv(T=6, S=6)
    lower = torch.ones(6, 6, dtype=torch.bool).tril()
    fast = at.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(fast, F.scaled_dot_product_attention(q, k, v, attn_mask=lower),
                               atol=1e-6, rtol=1e-6)  # fused causal vs fused masked


@pytest.mark.parametrize(("call", "pattern"), [
    (lambda q, k, v: at.scaled_dot_product_attention(q, k[..., :4], v), "k: expected"),
    (lambda q, k, v: at.scaled_dot_product_attention(q, k.double(), v), None),
    (lambda q, k, v: at.scaled_dot_product_attention(q, k, v, torch.ones(5, 6, dtype=torch.bool)),
     "mask: expected"),
    (lambda q, k, v: at.scaled_dot_product_attention(q, k, v, is_causal=1), "is_causal"),
])
def test_calls_the_fast_path_declines_still_get_attnlab_checks(call, pattern):
    q, k, v = qkv()
    if pattern is None:  # mixed dtypes are promoted, as on the checked path
        assert call(q, k, v).dtype == torch.float64
    else:
        with pytest.raises(AttnlabError, match=pattern):
            call(q, k, v)


# ------------------------------------------------------------- the compiler


def _breaks(fn, *args, **kwargs) -> tuple[int, int]:
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args, **kwargs)
    return explained.graph_count, explained.graph_break_count


def test_no_graph_breaks_in_sdpa_and_multihead_attention():
    q, k, v = qkv()
    assert _breaks(at.scaled_dot_product_attention, q, k, v) == (1, 0)
    assert _breaks(at.scaled_dot_product_attention, q, k, v, MASKS["(T, S)"]) == (1, 0)
    assert _breaks(at.scaled_dot_product_attention, q, k, v, return_weights=True) == (1, 0)
    mha = at.MultiHeadAttention(4, 16)
    x = torch.randn(2, 5, 16)
    assert _breaks(mha, x, x, x)[1] == 0
    layer = at.SelfAttentionLayer(16, 4, dropout=0.0)
    assert _breaks(layer, x)[1] == 0


def test_fullgraph_compiled_training_step_equals_eager():
    torch.manual_seed(0)
    layer = at.SelfAttentionLayer(16, 4, dropout=0.0)
    x = torch.randn(2, 6, 16)

    def loss_of(module: torch.nn.Module) -> torch.Tensor:
        return module(x, is_causal=True).square().mean()

    eager = loss_of(layer)
    eager.backward()
    eager_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    compiled = torch.compile(loss_of, fullgraph=True, backend="aot_eager")(layer)
    compiled.backward()
    # aot_eager runs the same ops, traced: equal to float32 rounding of reordered sums.
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)
    for p, g in zip(layer.parameters(), eager_grads, strict=True):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------- autocast


def test_autocast_runs_as_torch_nn_does():
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    ours = from_torch_multihead(ref)
    linear = torch.nn.Linear(16, 16)
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = linear(x)
        assert h.dtype == torch.bfloat16
        expected, _ = ref(h, h, h)
        got = ours(h, h, h)
        got = got[0] if isinstance(got, tuple) else got
        ln_expected = torch.nn.LayerNorm(16)(h)
        ln_got = at.LayerNorm(16)(h)
        layer_out = at.SelfAttentionLayer(16, 4, dropout=0.0).eval()(h)
    assert got.dtype == expected.dtype == torch.bfloat16
    # The same bfloat16 ops in a different order: a few units of bfloat16's 2**-8.
    torch.testing.assert_close(got.float(), expected.float(), atol=1e-2, rtol=1e-2)
    assert ln_got.dtype == ln_expected.dtype
    torch.testing.assert_close(ln_got, ln_expected)
    assert layer_out.dtype == torch.bfloat16 and torch.isfinite(layer_out.float()).all()
    # Outside autocast a dtype mismatch is still refused by name.
    with pytest.raises(AttnlabError, match="x: expected dtype torch.float32"):
        at.LayerNorm(16)(x.bfloat16())


# ------------------------------------------------------------- vmap, meta, export


def test_vmap_per_sample_gradients_equal_a_loop():
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(0)
    mha = at.MultiHeadAttention(2, 8)
    params = {name: p.detach() for name, p in mha.named_parameters()}
    xs = torch.randn(3, 4, 8)  # 3 samples of (T, E)

    def loss(p: dict, x: torch.Tensor) -> torch.Tensor:
        x = x[None]  # (1, T, E)
        out = functional_call(mha, p, (x, x, x))
        out = out[0] if isinstance(out, tuple) else out
        return out.square().sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    for i in range(3):
        one = grad(loss)(params, xs[i])
        for name in params:
            torch.testing.assert_close(per_sample[name][i], one[name], atol=1e-6, rtol=1e-6)


def test_meta_and_fake_tensors_infer_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    mha = at.MultiHeadAttention(4, 16, device="meta")
    x = torch.empty(2, 5, 16, device="meta")
    out = mha(x, x, x)
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape == (2, 5, 16) and out.device.type == "meta"
    with FakeTensorMode():
        q, k, v = (torch.empty(2, 3, n, 8) for n in (5, 7, 7))
        assert at.scaled_dot_product_attention(q, k, v, is_causal=True).shape == (2, 3, 5, 8)


def test_torch_export_of_multihead_attention():
    torch.manual_seed(0)
    mha = at.MultiHeadAttention(4, 16).eval()
    x = torch.randn(2, 5, 16)
    program = torch.export.export(mha, (x, x, x))
    got = program.module()(x, x, x)
    expected = mha(x, x, x)
    got = got[0] if isinstance(got, tuple) else got
    expected = expected[0] if isinstance(expected, tuple) else expected
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
