"""Gradient diagnostics on torch modules: parity with NumPy, head splits, hook hygiene.

Norm tolerance 1e-9 relative (float64), as in test_grad_torch: the same float64
gradients summed in a different order.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from attnlab import AttnlabError, MultiHeadAttention  # noqa: E402
from attnlab.lens.grad_diagnostics import GradReport, grad_norms  # noqa: E402
from attnlab.lens.grad_torch import torch_grad_norms, watch_gradients  # noqa: E402

TOL = {"rtol": 1e-9, "atol": 1e-12}


@pytest.fixture
def setup():
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention.init(4, 8, seed=1)
    mha.bq, mha.bv, mha.bo = rng.standard_normal(8), rng.standard_normal(8), rng.standard_normal(8)
    x = rng.standard_normal((2, 5, 8))
    G = rng.standard_normal((2, 5, 8))
    return mha, x, G



def to_torch_mha(mha: MultiHeadAttention) -> torch.nn.MultiheadAttention:
    E, H = mha.Wq.shape[0], mha.num_heads
    module = torch.nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    zeros = np.zeros(E)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.tensor(np.concatenate([mha.Wq, mha.Wk, mha.Wv], 1).T))
        module.in_proj_bias.copy_(torch.tensor(np.concatenate(
            [b if b is not None else zeros for b in (mha.bq, mha.bk, mha.bv)]
        )))
        module.out_proj.weight.copy_(torch.tensor(mha.Wo.T))
        module.out_proj.bias.copy_(torch.tensor(mha.bo if mha.bo is not None else zeros))
    return module


class GroupedAttention(torch.nn.Module):
    """A Llama-style module: q_proj / k_proj / v_proj / o_proj, GQA, ``num_heads`` attribute."""

    def __init__(self, mha: MultiHeadAttention):
        super().__init__()
        self.num_heads, self.num_kv_heads = mha.num_heads, mha.num_kv_heads
        for name, w, b in (("q_proj", mha.Wq, mha.bq), ("k_proj", mha.Wk, mha.bk),
                           ("v_proj", mha.Wv, mha.bv), ("o_proj", mha.Wo, mha.bo)):
            linear = torch.nn.Linear(*w.shape, dtype=torch.float64)
            with torch.no_grad():
                linear.weight.copy_(torch.tensor(w.T))
                linear.bias.copy_(torch.tensor(b))
            setattr(self, name, linear)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, -1).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, -1).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, -1).transpose(1, 2)  # (B, Hkv, T, Dv)
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # (B, H, T, Dv)
        return self.o_proj(heads.transpose(1, 2).reshape(B, T, -1))  # (B, T, E)


class Seed001Attention(torch.nn.Module):
    """Seed 001's layout: ``self.h`` and ``self.linears`` = 4 Linear (q, k, v, out)."""

    def __init__(self, h: int, d_model: int):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = torch.nn.ModuleList(
            torch.nn.Linear(d_model, d_model, dtype=torch.float64) for _ in range(4)
        )
        self.unused = torch.nn.Linear(2, 2, dtype=torch.float64)  # never called in forward

    def forward(self, x):
        B = x.size(0)
        q, k, v = (lin(x).view(B, -1, self.h, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
                   for lin in self.linears[:3])
        heads = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.linears[-1](heads.transpose(1, 2).reshape(B, -1, self.h * self.d_k))


def assert_same_norms(numpy_report: GradReport, torch_report: GradReport, pairs) -> None:
    for numpy_name, torch_name in pairs:
        np.testing.assert_allclose(
            numpy_report.head_norms[numpy_name], torch_report.head_norms[torch_name], **TOL,
            err_msg=f"{numpy_name} vs {torch_name}",
        )


def test_watch_nn_multihead_attention_matches_numpy(setup):
    mha, x, G = setup
    module = to_torch_mha(mha)
    tx = torch.tensor(x)
    with watch_gradients(module) as watch:
        out, _ = module(tx, tx, tx, need_weights=False)
        (out * torch.tensor(G)).sum().backward()
    ours, theirs = grad_norms(mha, x, G), watch.report()
    assert_same_norms(ours, theirs, [
        ("Wq", "in_proj_weight[q]"), ("Wk", "in_proj_weight[k]"), ("Wv", "in_proj_weight[v]"),
        ("bq", "in_proj_bias[q]"), ("bv", "in_proj_bias[v]"), ("Wo", "out_proj.weight"),
    ])
    assert theirs.norms["out_proj.bias"] == pytest.approx(ours.norms["bo"], rel=1e-9)
    assert theirs.output_norm == pytest.approx(ours.output_norm, rel=1e-12)
    assert not theirs.vanishing
    assert {n for n, kind in theirs.flags().items() if kind == "zero_by_design"} == {
        f"in_proj_bias[k][head {h}]" for h in range(4)}


def test_generic_gqa_module_nested_and_via_torch_grad_norms(setup):
    _, x, G = setup
    mha = MultiHeadAttention.init(4, 8, num_kv_heads=2, seed=4)
    mha.bq, mha.bk, mha.bv, mha.bo = (np.full(n, 0.1) for n in (8, 4, 4, 8))
    model = torch.nn.Sequential(GroupedAttention(mha))  # parameter names get the "0." prefix
    tG = torch.tensor(G)
    theirs = torch_grad_norms(model, lambda out: (out * tG).sum(), torch.tensor(x))
    assert all(p.grad is None for p in model.parameters())  # autograd.grad, not .backward
    assert_same_norms(grad_norms(mha, x, G), theirs, [
        ("Wq", "0.q_proj.weight"), ("Wk", "0.k_proj.weight"), ("Wv", "0.v_proj.weight"),
        ("Wo", "0.o_proj.weight"), ("bq", "0.q_proj.bias"), ("bv", "0.v_proj.bias"),
    ])
    assert theirs.head_norms["0.k_proj.weight"].shape == (2,)
    assert "0.o_proj.bias" not in theirs.head_norms


def test_seed001_layout_and_unused_parameters():
    torch.manual_seed(0)
    module = Seed001Attention(h=2, d_model=6)
    report = torch_grad_norms(module, lambda out: out.pow(2).sum(), torch.randn(1, 3, 6,
                                                                               dtype=torch.float64))
    assert {k: v.shape for k, v in report.head_norms.items()} == {
        **{f"linears.{i}.weight": (2,) for i in range(4)},
        **{f"linears.{i}.bias": (2,) for i in range(3)},
    }
    # A parameter the forward never used got no gradient at all: norm 0, vanishing.
    assert report.norms["unused.weight"] == 0.0 and "unused.weight" in report.vanishing
    assert torch_grad_norms(
        module, lambda out: out.pow(2).sum(), torch.ones(1, 3, 6, dtype=torch.float64),
        num_heads=3,
    ).head_norms["linears.0.weight"].shape == (3,)


def hooks_left(module: torch.nn.Module) -> list[str]:
    left = []
    for name, sub in module.named_modules():
        for kind in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                     "_backward_pre_hooks"):
            if getattr(sub, kind):
                left.append(f"{name or '<root>'}.{kind}")
    for name, param in module.named_parameters():
        if param._backward_hooks:
            left.append(f"{name}._backward_hooks")
    return left


@pytest.mark.parametrize("fail_after", ["enter", "forward", "backward"])
def test_hooks_are_removed_even_on_an_exception(fail_after):
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(1, 3, 8)
    outputs = []
    with pytest.raises(RuntimeError, match="boom"):
        with watch_gradients(module):
            assert hooks_left(module)  # the hooks were really there
            if fail_after != "enter":
                out, _ = module(x, x, x)
                outputs.append(out)
                assert out._backward_hooks  # the output tensor hook
            if fail_after == "backward":
                out.sum().backward()
            raise RuntimeError("boom")
    assert hooks_left(module) == []
    assert all(not out._backward_hooks for out in outputs)


def test_user_hooks_survive_and_report_needs_a_backward():
    module = torch.nn.Linear(4, 4)
    calls = []
    mine = module.register_forward_hook(lambda *args: calls.append(1))
    with watch_gradients(module) as watch:
        module(torch.randn(2, 4))
    assert list(module._forward_hooks) == [mine.id]
    assert calls == [1]
    mine.remove()
    with pytest.raises(AttnlabError, match="no gradient reached"):
        watch.report()
    with pytest.raises(AttnlabError, match="module: expected a torch.nn.Module"):
        with watch_gradients("not a module"):  # type: ignore[arg-type]
            pass
