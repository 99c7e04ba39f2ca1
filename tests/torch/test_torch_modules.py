"""attnlab.torch's modules: construction, initialisation, modes, conversions, import rules.

Numerical parity with the other implementations is in test_torch_parity.py; this
file checks the plumbing around it. Tolerances: conversions must be exact (a
copy of the same floats), the fused and plain paths' gradients agree to 1e-12
in float64 (the same rounding argument as for the outputs).
"""

from __future__ import annotations

import doctest
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import attnlab
import attnlab.torch as at
import attnlab.torch.attention
import attnlab.torch.convert
import attnlab.torch.debug
import attnlab.torch.kv_cache
import attnlab.torch.layers
import attnlab.torch.masks
import attnlab.torch.multihead
import attnlab.torch.positional

SRC = str(Path(attnlab.__file__).resolve().parents[1])


@pytest.mark.parametrize(
    "module",
    [attnlab.torch.attention, attnlab.torch.convert, attnlab.torch.debug,
     attnlab.torch.kv_cache, attnlab.torch.layers, attnlab.torch.masks,
     attnlab.torch.multihead, attnlab.torch.positional],
)
def test_doctests_pass(module):
    results = doctest.testmod(module)
    assert results.attempted > 0
    assert results.failed == 0


# --------------------------------------------------------------------------- imports


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )


def test_importing_attnlab_does_not_import_torch():
    result = run_python("import sys, attnlab; print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_attnlab_torch_without_torch_says_what_to_install():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if torch were not installed\n"
        "try:\n"
        "    import attnlab.torch\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "attnlab.torch needs the 'torch' package" in result.stdout
    assert "pip install 'attnlab[torch]'" in result.stdout


# --------------------------------------------------------------------------- init


def test_mha_seed_001_signature_and_parameter_shapes():
    mha = at.MultiHeadAttention(8, 64)  # seed 001: MultiHeadAttention(h, d_model)
    assert (mha.num_heads, mha.head_dim, mha.value_head_dim, mha.dropout) == (8, 8, 8, 0.0)
    assert "num_heads=8, d_model=64" in repr(mha)
    shapes = {name: tuple(p.shape) for name, p in mha.named_parameters()}
    assert shapes == {
        "q_proj.weight": (64, 64), "q_proj.bias": (64,), "k_proj.weight": (64, 64),
        "k_proj.bias": (64,), "v_proj.weight": (64, 64), "v_proj.bias": (64,),
        "out_proj.weight": (64, 64), "out_proj.bias": (64,),
    }
    gqa = at.MultiHeadAttention(8, 64, num_kv_heads=2, use_bias=False)
    assert tuple(gqa.k_proj.weight.shape) == (16, 64) and gqa.k_proj.bias is None


def test_mha_xavier_init_by_default():
    gen = torch.Generator().manual_seed(0)
    mha = at.MultiHeadAttention(4, 96, num_kv_heads=2, generator=gen, v_gain=0.5)
    for linear, gain in ((mha.q_proj, 1.0), (mha.k_proj, 1.0), (mha.v_proj, 0.5),
                         (mha.out_proj, 1.0)):
        fan_out, fan_in = linear.weight.shape
        bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
        assert linear.weight.abs().max() <= bound
        assert linear.weight.abs().max() > 0.9 * bound  # uniform on [-a, a], not smaller
        # variance of U(-a, a) is a^2 / 3; 2000+ samples: 15% is > 5 standard errors
        assert abs(linear.weight.var().item() / (bound**2 / 3) - 1) < 0.15
        assert (linear.bias == 0).all()
    again = at.MultiHeadAttention(4, 96, num_kv_heads=2,
                                  generator=torch.Generator().manual_seed(0), v_gain=0.5)
    assert all(torch.equal(a, b) for a, b in zip(mha.parameters(), again.parameters(), strict=True))


def test_layer_submodules_have_seed_001_names():
    layer = at.SelfAttentionLayer(16, 4)  # seed 001: SelfAttentionLayer(d_model, h, dropout=0.1)
    assert isinstance(layer.self_attn, at.MultiHeadAttention)
    assert isinstance(layer.norm1, nn.LayerNorm) and isinstance(layer.dropout, nn.Dropout)
    assert layer.dropout.p == 0.1 and layer.norm == "post" and layer.training
    assert at.SelfAttentionLayer(16, 4, 0.2).dropout.p == 0.2  # the seed's positional dropout


# --------------------------------------------------------------------------- modes


def test_mha_dropout_only_in_training_mode():
    mha = at.MultiHeadAttention(2, 8, dropout=0.5, dtype=torch.float64)
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    out_a, w_a = mha(x, x, x, return_weights=True)
    fused_a, _ = mha(x, x, x)
    assert (w_a == 0).any()  # dropped weights are returned as used
    mha.eval()
    out_b, w_b = mha(x, x, x, return_weights=True)
    assert torch.allclose(w_b.sum(-1), torch.ones(2, 2, 6, dtype=torch.float64))
    assert not torch.allclose(out_a, out_b) and not torch.allclose(fused_a, out_b)
    assert torch.equal(mha(x, x, x)[0], mha(x, x, x)[0])


def test_layer_dropout_only_in_training_mode():
    layer = at.SelfAttentionLayer(8, 2, dropout=0.5)
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    assert not torch.equal(layer(x), layer(x))
    layer.eval()
    assert torch.equal(layer(x), layer(x))


# --------------------------------------------------------------------------- twin paths


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": "random"}, {"bias": "random"}])
def test_fused_and_plain_paths_agree_in_gradients_too(kw):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
               for _ in range(3))
    if kw.get("mask") == "random":
        kw = {"mask": torch.rand(5, 5, generator=g) < 0.6}
        kw["mask"][2] = False  # a row with nothing to attend to: gradient 0, not NaN
    if kw.get("bias") == "random":
        kw = {"bias": torch.randn(3, 5, 5, dtype=torch.float64, generator=g)}
    grads = []
    for return_weights in (False, True):
        result = at.scaled_dot_product_attention(q, k, v, **kw, return_weights=return_weights)
        out = result[0] if return_weights else result
        grads.append(torch.autograd.grad((out * out.detach().sign()).sum(), (q, k, v)))
    for fused_grad, plain_grad in zip(*grads, strict=True):
        assert not torch.isnan(fused_grad).any() and not torch.isnan(plain_grad).any()
        # 1e-12: float64 rounding only, gradients are O(1) here
        assert (fused_grad - plain_grad).abs().max() <= 1e-12


def test_softmax_follows_the_core_rule():
    x = torch.tensor([[1.0, 2.0, float("-inf")], [float("-inf")] * 3], dtype=torch.float64)
    ref = attnlab.softmax(x.numpy())
    assert np.abs(at.softmax(x).numpy() - ref).max() <= 1e-15  # same ops, same order
    assert (at.softmax(x)[1] == 0).all()


def test_causal_mask_matches_core():
    for T, S in [(3, 3), (2, 5), (5, 2), (0, 3), (1, 1)]:
        assert np.array_equal(at.causal_mask(T, S).numpy(), attnlab.causal_mask(T, S))


# --------------------------------------------------------------------------- conversions


def test_mha_numpy_round_trip_is_exact():
    core = attnlab.MultiHeadAttention.init(4, 12, num_kv_heads=2, head_dim=5, d_context=7,
                                           seed=3)
    core.bk = None  # one missing bias
    module = at.MultiHeadAttention.from_numpy(core)
    assert module.q_proj.weight.dtype == torch.float64 and module.k_proj.bias is None
    assert (module.head_dim, module.d_context, module.num_kv_heads) == (5, 7, 2)
    back = module.to_numpy()
    for name, value in core.parameters().items():
        assert np.array_equal(back.parameters()[name], value), name
    assert back.bk is None
    assert at.to_numpy(module).parameters().keys() == core.parameters().keys()
    assert isinstance(at.from_numpy(core), at.MultiHeadAttention)


def test_mha_from_numpy_float32_stays_float32():
    core = attnlab.MultiHeadAttention.init(2, 8, dtype=np.float32)
    assert at.MultiHeadAttention.from_numpy(core).q_proj.weight.dtype == torch.float32
    assert at.MultiHeadAttention.from_numpy(core, dtype=torch.float64).q_proj.weight.dtype == (
        torch.float64
    )


def test_layer_and_layer_norm_round_trips():
    layer = at.SelfAttentionLayer(8, 2, dropout=0.2, norm="pre", num_kv_heads=1, eps=1e-4,
                                  generator=torch.Generator().manual_seed(0)).eval()
    core = layer.to_numpy()
    assert (core.norm, core.dropout.p, core.norm1.eps, core.training) == ("pre", 0.2, 1e-4, False)
    again = at.from_numpy(core)
    assert isinstance(again, at.SelfAttentionLayer) and again.norm == "pre"
    assert not again.training
    pairs = zip(layer.state_dict().items(), again.state_dict().items(), strict=True)
    for (name, a), (_, b) in pairs:
        assert torch.equal(a.double(), b.double()), name
    norm = at.LayerNorm(6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(1))
    back = at.to_numpy(norm)
    assert np.array_equal(back.gamma, norm.weight.detach().numpy())
    assert isinstance(at.from_numpy(back), at.LayerNorm)
    assert isinstance(at.from_numpy(attnlab.positional.SinusoidalPositionalEncoding(4, 8)),
                      at.PositionalEncoding)
    assert at.to_numpy(at.PositionalEncoding(4, 8)).max_len == 8


def test_bfloat16_parameters_convert_to_float32_arrays():
    mha = at.MultiHeadAttention(2, 8).to(torch.bfloat16)
    core = mha.to_numpy()
    assert core.Wq.dtype == np.float32
    assert np.array_equal(core.Wq, mha.q_proj.weight.detach().float().numpy().T)


def test_torch_multihead_round_trip_without_bias_and_with_kdim():
    ours = at.MultiHeadAttention(2, 8, d_context=5, use_bias=False)
    theirs = at.to_torch_multihead(ours)
    assert theirs.in_proj_bias is None and theirs.kdim == 5 and theirs.batch_first
    back = at.from_torch_multihead(theirs)
    pairs = zip(ours.state_dict().values(), back.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_finite_check_is_not_fooled_by_an_overflowing_sum():
    # The debug NaN/Inf check first sums each input; 3e38 + 3e38 overflows float32 to
    # inf, so the exact element-wise check must decide, and accept, these finite values.
    enc = at.PositionalEncoding(4, max_len=8).eval()
    x = torch.full((1, 2, 4), 3e38)
    with at.debug_checks():
        assert torch.isfinite(enc(x)).all()
        with pytest.raises(attnlab.AttnlabError, match=r"^x: expected finite values, got 1 "):
            enc(torch.cat([x, torch.full((1, 1, 4), 3e38).index_fill(2, torch.tensor([1]),
                                                                     float("nan"))], dim=1))


def test_layer_norm_of_huge_values_matches_the_numpy_core_not_nan():
    """torch's kernel gives NaN when the squares overflow; the result is scale-invariant."""
    x = np.array([[1e200, -1e200, 0.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    norm = at.LayerNorm(4, dtype=torch.float64)
    out = norm(torch.from_numpy(x)).detach().numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, attnlab.LayerNorm(4)(x), rtol=1e-12, atol=1e-300)
    x32 = torch.tensor([[3e38, -3e38, 0.0, 1.0], [3e38, 3e38, 3e38, 3e38]])
    out32 = at.LayerNorm(4)(x32)
    assert torch.isfinite(out32).all() and (out32[1] == 0).all()  # a constant row: 0


@pytest.mark.parametrize("scale", [None, 1.0, 0.3])
def test_mha_scale_matches_the_numpy_twin_and_survives_conversion(scale):
    """Both twins multiply the scores by ``scale`` (None: 1/√D); the conversions keep it.
    float64 on both sides, the same sums in a different order: 1e-12."""
    core = attnlab.MultiHeadAttention.init(2, 8, seed=4, scale=scale)
    module = at.MultiHeadAttention.from_numpy(core)
    assert module.scale == scale and module.to_numpy().scale == scale
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    mask = np.tril(np.ones((5, 5), dtype=bool))
    expected, expected_weights = core(x, mask=mask, return_weights=True)
    t = torch.from_numpy(x)
    out, weights = module(t, t, t, mask=torch.from_numpy(mask), return_weights=True)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights.detach().numpy(), expected_weights, rtol=1e-12,
                               atol=1e-12)
    if scale is not None:
        assert f"scale={scale:g}" in repr(module)
