"""GQA's head expansion: the NumPy module and its torch twin give the same heads, query
head h reads key/value head h // G, and gqa_reduce is repeat_kv's adjoint (the gradient
autograd computes through repeat_kv)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from attnlab import ShapeError, gqa
from attnlab.torch import gqa as torch_gqa


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_repeat_kv_gives_query_head_h_the_kv_head_h_over_g(groups):
    kv = np.random.default_rng(0).standard_normal((2, 3, 5, 4))  # (B, Hkv, S, D)
    repeated = gqa.repeat_kv(kv, groups)  # (B, H, S, D)
    assert repeated.shape == (2, 3 * groups, 5, 4)
    for h in range(3 * groups):
        np.testing.assert_array_equal(repeated[:, h], kv[:, h // groups])
    # The torch twin copies the same values: an exact match.
    np.testing.assert_array_equal(torch_gqa.repeat_kv(torch.from_numpy(kv), groups).numpy(),
                                  repeated)


@pytest.mark.parametrize("groups", [1, 3])
def test_gqa_reduce_is_the_adjoint_of_repeat_kv(groups):
    rng = np.random.default_rng(1)
    kv = torch.tensor(rng.standard_normal((2, 2, 5, 3)), requires_grad=True)  # (B, Hkv, S, D)
    grad = rng.standard_normal((2, 2 * groups, 5, 3))  # (B, H, S, D)
    torch_gqa.repeat_kv(kv, groups).backward(torch.from_numpy(grad))
    # float64 sums of at most 3 terms in different orders: 1e-12.
    np.testing.assert_allclose(gqa.gqa_reduce(grad, groups), kv.grad.numpy(), atol=1e-12)
    np.testing.assert_allclose(torch_gqa.gqa_reduce(torch.from_numpy(grad), groups).numpy(),
                               kv.grad.numpy(), atol=1e-12)


@pytest.mark.parametrize(("q", "k", "v", "where"), [
    ((2, 4, 3), (4, 3), (4, 3), "k: expected (..., Hkv, S, D)"),
    ((4, 3, 2), (2, 3, 2), (1, 3, 2), "v: expected (..., 2, S, Dv)"),
    ((6, 3, 2), (4, 3, 2), (4, 3, 2), "divides q's H = 6"),
])
def test_check_gqa_heads_names_the_argument(q, k, v, where):
    with pytest.raises(ShapeError, match=re.escape(where)):
        gqa.check_gqa_heads(q, k, v)
    assert torch_gqa.check_gqa_heads is gqa.check_gqa_heads  # one rule, one set of messages
