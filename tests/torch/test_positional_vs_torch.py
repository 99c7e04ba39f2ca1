"""attnlab.positional against torch references (none of them calls attnlab).

- seed 001's torch ``PositionalEncoding``, reconstructed verbatim;
- Hugging Face's ``rotate_half`` RoPE and Meta LLaMA's complex ``view_as_complex``
  RoPE, both rewritten here in torch.

The NumPy-only tests (scalar ``math`` loops over the textbook formulas, the ALiBi
paper's ``get_slopes``) are in tests/core/test_positional.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from attnlab.positional import SinusoidalPositionalEncoding, sinusoidal_encoding
from attnlab.positional_relative import apply_rope


class SeedPositionalEncoding(nn.Module):
    """Seed 001's code, verbatim except for the ``=``, ``,`` and quotes lost in extraction."""

    def __init__(self, d_model, max_len=5000):
        super().__init__()
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


def seed_table(d_model: int, max_len: int = 5000) -> np.ndarray:  # -> (max_len, E)
    buffer = SeedPositionalEncoding(d_model, max_len).pe  # (1, max_len, E)
    assert isinstance(buffer, torch.Tensor)
    return buffer[0].numpy()


@pytest.fixture
def torch_float64() -> Iterator[None]:
    """Run the seed code with float64 as torch's default dtype, then restore it."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def hf_rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rope(x: torch.Tensor, position_ids: torch.Tensor, base: float) -> torch.Tensor:
    """Hugging Face LlamaRotaryEmbedding + apply_rotary_pos_emb, in float64."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    freqs = torch.outer(position_ids.double(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + hf_rotate_half(x) * emb.sin()


def meta_apply_rope(x: torch.Tensor, position_ids: torch.Tensor, base: float) -> torch.Tensor:
    """Meta LLaMA / RoFormer: pairs (x0, x1), (x2, x3), ... as complex numbers."""
    dim = x.shape[-1]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2)[: dim // 2].double() / dim))
    freqs = torch.outer(position_ids.double(), freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # e^{i pos theta}
    x_complex = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_complex * freqs_cis).flatten(-2)


@pytest.mark.parametrize("d_model", [2, 8, 64, 512])
def test_sinusoidal_matches_seed_code_float64(torch_float64: None, d_model: int) -> None:
    reference = seed_table(d_model)
    assert reference.dtype == np.float64
    ours = sinusoidal_encoding(5000, d_model)
    # Same float64 formula; positions up to 4999 make the angle's last-bit rounding
    # ~5e-13 at worst, measured 6e-14.
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-12)


def test_sinusoidal_module_call_matches_seed_forward(torch_float64: None) -> None:
    x = np.random.default_rng(0).standard_normal((2, 7, 16))  # (B, T, E)
    expected = SeedPositionalEncoding(16, max_len=50)(torch.from_numpy(x)).numpy()
    got = SinusoidalPositionalEncoding(16, max_len=50)(x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)  # float64, as above


def test_sinusoidal_float32_matches_seed_code_float32() -> None:
    reference = seed_table(64, max_len=16)
    assert reference.dtype == np.float32
    ours = sinusoidal_encoding(16, 64, dtype=np.float32)
    assert ours.dtype == np.float32
    # torch rounds the angle p * div_term to float32 (relative error ~1e-7), so the
    # difference grows with p: ~3e-7 at p < 16 (and ~2e-4 at p = 5000).
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)


def test_sinusoidal_float32_is_the_float64_table_rounded_once(torch_float64: None) -> None:
    reference = seed_table(64)
    ours = sinusoidal_encoding(5000, 64, dtype=np.float32)
    # Rounding values in [-1, 1] to float32 costs at most half an ulp of 1.0 = 2**-24.
    np.testing.assert_allclose(ours, reference, rtol=0, atol=2.0**-24)


def test_seed_code_cannot_build_an_odd_width_table() -> None:
    """attnlab follows the formula for odd widths (tests/core/test_positional.py)."""
    with pytest.raises(RuntimeError):
        SeedPositionalEncoding(7, max_len=10)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_matches_hugging_face_rotate_half(base: float) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 16))  # (B, H, T, D)
    positions = np.array([0, 1, 2, 5, 9, 40, 123])
    expected = hf_apply_rope(torch.from_numpy(x), torch.from_numpy(positions), base).numpy()
    got = apply_rope(x, positions, base=base)
    # float64; angles up to 123 rad carry ~1e-14 absolute rounding, inv_freq is
    # computed as 1/b**e here vs b**-e there (1 ulp apart).
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_rope_interleaved_matches_complex_formulation() -> None:
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 16))  # (B, H, T, D)
    positions = np.array([3, 4, 5, 6, 7, 8, 1000])
    expected = meta_apply_rope(torch.from_numpy(x), torch.from_numpy(positions), 10000.0)
    got = apply_rope(x, positions, interleaved=True)
    np.testing.assert_allclose(got, expected.numpy(), rtol=0, atol=1e-12)  # as above, float64

