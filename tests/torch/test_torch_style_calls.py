"""Calls written in torch.nn.MultiheadAttention's style either mean the same thing on
attnlab's MultiHeadAttention or are refused: never a silently different answer.

Each test here reproduces one way a torch user got wrong numbers without an error
(the call returned a tensor that ``out, _ = ...`` split along the batch; a converted
module ignored ``batch_first=False``; the 4th positional argument read torch's
``key_padding_mask`` as attnlab's opposite-meaning ``mask``). The reference is always
``torch.nn.MultiheadAttention`` itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import attnlab
import attnlab.torch as at

# float64, the same sums in a (possibly) different order: 1e-12.
TOL64 = {"rtol": 1e-12, "atol": 1e-12}


def torch_module(E=8, H=2, **kwargs) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    module = nn.MultiheadAttention(E, H, dtype=torch.float64, **kwargs).eval()
    with torch.no_grad():  # non-zero biases, so that a misplaced one shows
        for p in (module.in_proj_bias, module.out_proj.bias):
            if p is not None:
                p.normal_(0.0, 0.1)
    return module


def test_torch_idiom_unpacks_the_output_not_the_batch():
    """``out, _ = mha(x, x, x)`` at batch 2: attnlab returns (out, weights) like torch, so
    ``out`` is the whole batch (it used to be sample 0, broadcast by the residual add)."""
    theirs = torch_module(batch_first=True)
    ours = at.from_torch_multihead(theirs).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    out, weights = ours(x, x, x)
    ref, _ = theirs(x, x, x, need_weights=False)
    assert weights is None and out.shape == (2, 5, 8)
    torch.testing.assert_close(x + out, x + ref, **TOL64)
    core_out, core_weights = ours.to_numpy()(x.numpy())  # the NumPy twin: the same pair
    assert core_weights is None
    np.testing.assert_allclose(core_out, ref.detach().numpy(), **TOL64)


@pytest.mark.parametrize("batched", [True, False])
def test_converted_module_keeps_torchs_sequence_first_layout(batched):
    """``nn.MultiheadAttention()`` is (T, B, E) by default; the converted module reads the
    same layout (it used to attend across the batch)."""
    theirs = torch_module()  # batch_first=False, torch's default
    ours = at.from_torch_multihead(theirs).eval()
    assert ours.batch_first is False
    x = torch.randn(*((6, 3) if batched else (6,)), 8, dtype=torch.float64)  # (T, B, E)
    ctx = torch.randn(*((4, 3) if batched else (4,)), 8, dtype=torch.float64)  # (S, B, E)
    kp = torch.tensor([[True, True, False, True]] * 3) if batched else None
    ref, ref_w = theirs(x, ctx, ctx, key_padding_mask=None if kp is None else ~kp,
                        average_attn_weights=False)
    out, w = ours(x, ctx, ctx, key_padding=kp, return_weights=True)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, **TOL64)
    torch.testing.assert_close(w, ref_w, **TOL64)
    back = at.to_torch_multihead(ours).eval()  # and the layout goes back too
    assert back.batch_first is False
    torch.testing.assert_close(back(x, ctx, ctx, need_weights=False)[0],
                               theirs(x, ctx, ctx, need_weights=False)[0], **TOL64)


def test_fourth_positional_argument_is_refused():
    """torch's 4th positional argument is key_padding_mask (True = padding); attnlab's masks
    mean the opposite, so they are keyword-only: a torch-style call cannot be misread
    (it used to be accepted whenever B == T and was wrong by ~1)."""
    ours = at.MultiHeadAttention(2, 8, dtype=torch.float64)
    x = torch.randn(4, 4, 8, dtype=torch.float64)  # B == T, where the old call was accepted
    padding = torch.tensor([[False, False, True, True]] * 4)
    with pytest.raises(TypeError, match="positional"):
        ours(x, x, x, padding)
    with pytest.raises(TypeError, match="key_padding_mask"):
        ours(x, x, x, key_padding_mask=padding)
    with pytest.raises(TypeError, match="positional"):
        at.SelfAttentionLayer(8, 2)(x.float(), padding)  # torch's src_mask position
    core = ours.to_numpy()
    with pytest.raises(TypeError, match="positional"):
        core(x.numpy(), x.numpy(), x.numpy(), padding.numpy())
    # The NumPy twin's 3rd positional input is now the values: a mask there is named.
    with pytest.raises(attnlab.AttnlabError, match=r"^value: .*keyword-only"):
        core(x.numpy(), x.numpy(), padding.numpy())
    with pytest.raises(TypeError, match="positional"):
        attnlab.SelfAttentionLayer(8, 2)(x.numpy(), padding.numpy())


def test_keys_and_values_from_inputs_of_different_widths():
    """torch's kdim != vdim: keys and values from their own inputs, in both twins."""
    theirs = torch_module(kdim=5, vdim=3, batch_first=True)
    ours = at.from_torch_multihead(theirs).eval()
    assert (ours.d_context, ours.d_value_context) == (5, 3)
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    key = torch.randn(2, 6, 5, dtype=torch.float64)
    value = torch.randn(2, 6, 3, dtype=torch.float64)
    ref, ref_w = theirs(x, key, value, average_attn_weights=False)
    out, w = ours(x, key, value, return_weights=True)
    torch.testing.assert_close(out, ref, **TOL64)
    torch.testing.assert_close(w, ref_w, **TOL64)
    core = ours.to_numpy()
    core_out, core_w = core(x.numpy(), key.numpy(), value.numpy(), return_weights=True)
    np.testing.assert_allclose(core_out, ref.detach().numpy(), **TOL64)
    np.testing.assert_allclose(core_w, ref_w.detach().numpy(), **TOL64)
    with pytest.raises(attnlab.AttnlabError, match=r"^value: expected an input of width 3"):
        core(x.numpy(), key.numpy())
    assert at.to_torch_multihead(ours).vdim == 3
