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


# ------------------------------------------- nn.MultiheadAttention's options, on attnlab's own

OPTIONS = [
    {"add_bias_kv": True},
    {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True, "kdim": 5, "vdim": 3},
    {"add_bias_kv": True, "bias": False, "batch_first": True},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o))
def test_state_dict_of_any_torch_module_loads_and_gives_its_outputs(options):
    """``load_state_dict(nn_mha.state_dict())`` (torch's keys: in_proj_weight, bias_k (1, 1, E),
    ...) on a module built with the same options gives torch's outputs, masks and all."""
    theirs = torch_module(**options)
    if theirs.bias_k is not None:
        with torch.no_grad():
            theirs.bias_k.normal_(), theirs.bias_v.normal_()
    ours = at.MultiHeadAttention(
        2, 8, d_context=options.get("kdim"), d_value_context=options.get("vdim"),
        use_bias=options.get("bias", True), batch_first=options.get("batch_first", False),
        add_bias_kv=options.get("add_bias_kv", False),
        add_zero_attn=options.get("add_zero_attn", False), dtype=torch.float64,
    ).eval()
    ours.load_state_dict(theirs.state_dict())
    B, T, S = 3, 4, 6
    lead = (lambda n: (B, n)) if theirs.batch_first else (lambda n: (n, B))
    x = torch.randn(*lead(T), 8, dtype=torch.float64)
    key = torch.randn(*lead(S), theirs.kdim, dtype=torch.float64)
    value = torch.randn(*lead(S), theirs.vdim, dtype=torch.float64)
    kp = torch.rand(B, S, generator=torch.Generator().manual_seed(3)) < 0.7
    blocked = torch.rand(T, S, generator=torch.Generator().manual_seed(4)) < 0.3
    for average in (False, True):
        ref, ref_w = theirs(x, key, value, key_padding_mask=~kp, attn_mask=blocked,
                            average_attn_weights=average)
        out, w = ours(x, key, value, key_padding=kp, mask=~blocked, return_weights=True,
                      average_attn_weights=average)
        torch.testing.assert_close(out, ref, **TOL64)
        torch.testing.assert_close(w, ref_w, **TOL64)
    fused, _ = ours(x, key, value, key_padding=kp, mask=~blocked)  # the no-weights path
    torch.testing.assert_close(fused, ref, **TOL64)
    # attnlab's bottom-right is_causal on top of the extra keys: torch given that mask
    causal = torch.ones(T, S, dtype=torch.bool).tril(S - T)  # True = may attend
    ref, _ = theirs(x, key, value, attn_mask=~causal, need_weights=False)
    torch.testing.assert_close(ours(x, key, value, is_causal=True)[0], ref, **TOL64)
    # and back: to_torch_multihead carries the options and parameters
    back = at.to_torch_multihead(ours).eval()
    assert (back.bias_k is None) == (theirs.bias_k is None)
    assert back.add_zero_attn == theirs.add_zero_attn
    torch.testing.assert_close(back(x, key, value)[0], theirs(x, key, value)[0], **TOL64)
    converted = at.from_torch_multihead(theirs).eval()
    torch.testing.assert_close(converted(x, key, value)[0],
                               theirs(x, key, value, need_weights=False)[0], **TOL64)


def test_average_attn_weights_is_the_mean_over_heads_in_both_twins():
    ours = at.MultiHeadAttention(4, 8, dtype=torch.float64)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    _, per_head = ours(x, x, x, return_weights=True)
    _, averaged = ours(x, x, x, return_weights=True, average_attn_weights=True)
    torch.testing.assert_close(averaged, per_head.mean(dim=1), **TOL64)
    _, core_averaged = ours.to_numpy()(x.numpy(), return_weights=True,
                                       average_attn_weights=True)
    np.testing.assert_allclose(core_averaged, averaged.detach().numpy(), **TOL64)
