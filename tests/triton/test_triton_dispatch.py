"""attnlab.torch.scaled_dot_product_attention(..., backend="triton") runs attnlab.triton."""

from __future__ import annotations

import pytest
import torch

import attnlab.torch as at
from attnlab import AttnlabError
from attnlab.triton import flash_attention


def qkv(B=2, H=4, Hkv=4, T=40, S=57, D=32):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, T, D, generator=gen), torch.randn(B, Hkv, S, D, generator=gen),
            torch.randn(B, Hkv, S, D, generator=gen))


def test_the_triton_backend_is_the_kernel_and_agrees_with_the_default_backend():
    q, k, v = qkv()
    key_padding = torch.arange(57)[None, :] >= torch.tensor([[0], [9]])  # (B, S) left padding
    mask = key_padding[:, None, None, :]  # (B, 1, 1, S), the usual sdpa form
    out = at.scaled_dot_product_attention(q, k, v, mask, is_causal=True, backend="triton")
    direct = flash_attention(q, k, v, is_causal=True, key_padding=key_padding)
    assert torch.equal(out, direct)
    default = at.scaled_dot_product_attention(q, k, v, mask, is_causal=True)
    # Two float32 paths (tiles with an online softmax vs torch's fused kernel): the float32
    # twice-rule tests measure ~1e-6 against float64 on such inputs.
    torch.testing.assert_close(out, default, rtol=0, atol=5e-6)


def test_the_triton_backend_takes_grouped_query_heads_under_the_torch_backends_rule():
    q, k, v = qkv(H=4, Hkv=2)
    out = at.scaled_dot_product_attention(q, k, v, backend="triton", scale=0.2, enable_gqa=True)
    expanded = [t.repeat_interleave(2, dim=1) for t in (k, v)]  # (B, H, S, D)
    default = at.scaled_dot_product_attention(q, *expanded, scale=0.2)
    torch.testing.assert_close(out, default, rtol=0, atol=5e-6)  # as above
    torch.testing.assert_close(
        at.scaled_dot_product_attention(q, k, v, scale=0.2, enable_gqa=True), default,
        rtol=0, atol=5e-6)
    # H != Hkv without enable_gqa: both backends refuse with the same message (the
    # triton backend used to do grouped-query attention silently).
    messages = []
    for backend in ("torch", "triton"):
        with pytest.raises(AttnlabError, match="q, k, v: expected leading") as raised:
            at.scaled_dot_product_attention(q, k, v, backend=backend)
        messages.append(str(raised.value))
    assert messages[0] == messages[1]
    with pytest.raises(AttnlabError, match="enable_gqa: expected True or False"):
        at.scaled_dot_product_attention(q, k, v, backend="triton", enable_gqa="yes")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"backend": "cuda"}, "backend: expected 'torch' or 'triton', got 'cuda'"),
        ({"backend": "triton", "bias": torch.zeros(40, 57)}, "bias: backend='triton'"),
        ({"backend": "triton", "dropout_p": 0.1}, "dropout_p: backend='triton'"),
        ({"backend": "triton", "return_weights": True}, "return_weights: backend='triton'"),
        ({"backend": "triton", "mask": torch.ones(40, 57, dtype=torch.bool)},
         "mask: backend='triton' takes a key-padding mask only"),
        ({"backend": "triton", "mask": torch.ones(2, 1, 1, 57)}, "mask: expected a bool tensor"),
    ],
)
def test_what_the_triton_backend_does_not_take_is_refused_by_name(options, words):
    q, k, v = qkv()
    with pytest.raises(AttnlabError) as info:
        at.scaled_dot_product_attention(q, k, v, **options)
    assert words in str(info.value)
