"""attnlab's ``sinks=`` against Hugging Face's own GPT-OSS eager attention
(``transformers.models.gpt_oss.modeling_gpt_oss.eager_attention_forward``), which appends
``module.sinks`` as one more column of logits and drops it after the softmax.

float64; tolerance 1e-12 (the same formula; GPT-OSS subtracts the row max itself).
"""

from __future__ import annotations

import pytest
import torch

import attnlab.torch as at

gpt_oss = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")


def test_sinks_equal_gpt_oss_eager_attention():
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, T, S, D = 2, 4, 2, 5, 5, 8
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, D, generator=gen, dtype=torch.float64)
    module = torch.nn.Module()
    module.sinks = torch.nn.Parameter(torch.randn(H, generator=gen, dtype=torch.float64))
    module.num_key_value_groups = H // Hkv
    causal = torch.ones(T, S, dtype=torch.bool).tril()
    additive = torch.zeros(T, S, dtype=torch.float64).masked_fill(~causal, float("-inf"))
    ref_out, ref_weights = gpt_oss.eager_attention_forward(
        module, q, k, v, additive[None, None], scaling=D**-0.5)
    out, weights = at.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True,
                                                   sinks=module.sinks, return_weights=True)
    torch.testing.assert_close(out.transpose(1, 2), ref_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, ref_weights, atol=1e-12, rtol=0)
