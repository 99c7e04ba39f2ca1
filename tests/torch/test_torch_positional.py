"""attnlab.torch's positional functions against their NumPy twins in attnlab.positional.

Tolerance: float64 results agree to 1e-12 (absolute, on values of size <= 1 for
tables and rotations, relative for ALiBi's slopes times distances): the same
formulas in float64, where libm's and torch's sin/cos/exp differ by an ulp at most.
Rounded dtypes are checked for "rounded once from the float64 value".
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnlab.positional as core
import attnlab.positional_relative as core_relative
import attnlab.torch as at
from attnlab.errors import AttnlabError, ShapeError

TOL = 1e-12


@pytest.mark.parametrize("max_len,d_model,base", [(50, 8, 10000.0), (7, 5, 100.0), (1, 1, 10.0),
                                                  (300, 64, 10000.0)])
def test_sinusoidal_encoding_matches_core(max_len, d_model, base):
    ours = at.sinusoidal_encoding(max_len, d_model, base=base)
    ref = core.sinusoidal_encoding(max_len, d_model, base=base)
    assert ours.dtype == torch.float64 and tuple(ours.shape) == ref.shape
    assert np.abs(ours.numpy() - ref).max() <= TOL  # 1e-12: same float64 formula, |values| <= 1
    as32 = at.sinusoidal_encoding(max_len, d_model, base=base, dtype=torch.float32)
    assert torch.equal(as32, ours.float())  # the float64 table rounded once


def test_positional_encoding_module_is_a_registered_buffer():
    enc = at.PositionalEncoding(16, max_len=32, dropout=0.0)
    assert "pe" in dict(enc.named_buffers()) and tuple(enc.pe.shape) == (1, 32, 16)
    assert "pe" in enc.state_dict()
    x = torch.zeros(3, 5, 16)
    assert torch.equal(enc(x), enc.pe[0, :5].float().expand(3, 5, 16))
    assert torch.equal(enc(x[:, :2], offset=3), enc.pe[0, 3:5].float().expand(3, 2, 16))


def test_positional_encoding_dropout_only_in_training():
    enc = at.PositionalEncoding(8, max_len=16, dropout=0.5)
    x = torch.ones(4, 6, 8)
    torch.manual_seed(0)
    trained = enc(x)
    assert (trained == 0).any()  # p = 0.5 over 192 values: all kept has probability 2**-192
    enc.eval()
    assert torch.equal(enc(x), x + enc.pe[0, :6].float())


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("positions", [None, 3, [0, 5, 2, 9]])
def test_apply_rope_matches_core(interleaved, positions):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 8))  # (B, H, T, D)
    ref = core_relative.apply_rope(x, positions, base=500.0, interleaved=interleaved)
    pos = torch.tensor(positions) if isinstance(positions, list) else positions
    ours = at.apply_rope(torch.from_numpy(x), pos, base=500.0, interleaved=interleaved)
    assert ours.dtype == torch.float64
    assert np.abs(ours.numpy() - ref).max() <= TOL  # 1e-12: same float64 rotation of O(1) values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_apply_rope_keeps_dtype_and_rounds_once(dtype):
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = at.apply_rope(x, 2)
    assert out.dtype == dtype
    if dtype != torch.float32:  # half types are rotated in float32, rounded once at the end
        assert torch.equal(out, at.apply_rope(x.float(), 2).to(dtype))


def test_rope_angles_match_core():
    cos, sin = at.rope_angles(torch.arange(7), 6, base=10.0, interleaved=True)
    ref_cos, ref_sin = core_relative.rope_angles(np.arange(7), 6, base=10.0, interleaved=True)
    assert np.abs(cos.numpy() - ref_cos).max() <= TOL  # 1e-12: float64 cos of the same angles
    assert np.abs(sin.numpy() - ref_sin).max() <= TOL


@settings(max_examples=25, deadline=None)
@given(num_heads=st.integers(1, 40), T=st.integers(0, 6), S=st.integers(0, 9))
def test_alibi_matches_core(num_heads, T, S):
    slopes = at.alibi_slopes(num_heads).numpy()
    ref_slopes = core_relative.alibi_slopes(num_heads)
    assert np.abs(slopes - ref_slopes).max() <= TOL * ref_slopes.max()  # 1e-12 relative
    bias = at.alibi_bias(num_heads, T, S).numpy()
    ref = core_relative.alibi_bias(num_heads, T, S)
    assert bias.shape == ref.shape
    # 1e-12 relative to the largest |bias| (slopes times integer distances)
    assert np.abs(bias - ref).max(initial=0.0) <= TOL * max(1.0, np.abs(ref).max(initial=0.0))


def test_alibi_bias_dtype_is_rounded_once():
    assert torch.equal(at.alibi_bias(6, 3, 5, dtype=torch.float32),
                       at.alibi_bias(6, 3, 5).float())


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: at.sinusoidal_encoding(0, 8), AttnlabError, r"max_len: expected an integer >= 1"),
        (lambda: at.sinusoidal_encoding(4, 8, base=-1.0), AttnlabError,
         r"base: expected a finite number > 0, got -1.0"),
        (lambda: at.sinusoidal_encoding(4, 8, dtype=torch.int64), AttnlabError,
         r"dtype: expected a torch float dtype"),
        (lambda: at.apply_rope(torch.zeros(3, 5)), ShapeError,
         r"x: RoPE rotates pairs of features, expected \(\.\.\., T, D\) with D even, "
         r"got shape \(3, 5\)"),
        (lambda: at.apply_rope(torch.zeros(4)), ShapeError,
         r"x: expected \(\.\.\., T, D\), got \(4\)"),
        (lambda: at.apply_rope(torch.zeros(3, 4), torch.tensor([0, 1])), ShapeError,
         r"positions: expected shape \(T,\) = \(3,\), got \(2\)"),
        (lambda: at.apply_rope(torch.zeros(2, 4), torch.tensor([0.0, 1.0])), AttnlabError,
         r"positions: expected integer positions, got dtype torch.float32"),
        (lambda: at.apply_rope(torch.zeros(2, 4), -2), AttnlabError,
         r"positions: expected an integer >= 0, got -2"),
        (lambda: at.apply_rope(np.zeros((2, 4))), AttnlabError,
         r"x: expected a torch.Tensor, got ndarray"),
        (lambda: at.rope_angles(None, 4), AttnlabError,
         r"positions: expected an int tensor of shape \(T,\), got None"),
        (lambda: at.rope_angles(torch.arange(3), 5), AttnlabError,
         r"head_dim: RoPE rotates pairs of features, expected an even D, got 5"),
        (lambda: at.alibi_slopes(0), AttnlabError, r"num_heads: expected an integer >= 1, got 0"),
        (lambda: at.alibi_bias(4, -1), AttnlabError, r"T: expected an integer >= 0, got -1"),
        (lambda: at.alibi_bias(4, 2, dtype="float32"), AttnlabError,
         r"dtype: expected a torch float dtype, got 'float32'"),
        (lambda: at.PositionalEncoding(8, max_len=4)(torch.zeros(1, 5, 8)), AttnlabError,
         r"x: positions 0\.\.4 \(offset=0, T=5\) do not fit in max_len=4"),
        (lambda: at.PositionalEncoding(8, max_len=9)(torch.zeros(1, 5, 8), offset=5), AttnlabError,
         r"expected offset \+ T <= 9"),
        (lambda: at.PositionalEncoding(8)(torch.zeros(5, 6)), ShapeError,
         r"x: expected \(\.\.\., T, E\) with E = d_model = 8, got \(5, 6\)"),
        (lambda: at.PositionalEncoding(8)(torch.zeros(5, 8, dtype=torch.int64)), AttnlabError,
         r"x: expected a float torch.Tensor, got torch.int64"),
        (lambda: at.PositionalEncoding(8, dropout=1.0), AttnlabError,
         r"dropout: expected a probability in \[0, 1\), got 1.0"),
        (lambda: at.PositionalEncoding(8, 16, 0.1), TypeError, r"positional argument"),
        (lambda: at.PositionalEncoding.from_numpy(object()), AttnlabError,
         r"encoding: expected an attnlab.positional.SinusoidalPositionalEncoding, got object"),
    ],
)
def test_positional_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: at.apply_rope(torch.zeros(2, 4), torch.tensor([0, -1])),
         r"positions: expected positions >= 0, got min -1"),
        (lambda: at.apply_rope(torch.full((2, 4), float("nan"))),
         r"x: expected finite values, got 8 non-finite \(first: NaN at index \(0, 0\)\)"),
        (lambda: at.PositionalEncoding(4)(torch.full((1, 2, 4), float("inf"))),
         r"x: expected finite values, got 8 non-finite \(first: Inf at index \(0, 0, 0\)\)"),
    ],
)
def test_positional_value_errors_under_debug_checks_only(call, match):
    with at.debug_checks(), pytest.raises(AttnlabError, match=match):
        call()
    call()  # by default the values are not read
