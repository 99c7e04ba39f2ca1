"""ring_attention and ulysses_attention on real gloo processes, against single-process attention.

All cases run in one spawn of 4 processes (starting processes costs far more than the
cases): a case for world size W runs on ranks 0 … W − 1 in a group of their own (the
whole world's default group for W = 4). Each rank returns its shards of out, lse and
the gradients; here they are unsharded and compared with attnlab.torch's single-process
attention over the full sequence, and with the NumPy virtual ring (simulate).

Tolerances, written where they are used:
- float64: 1e-12. The ring reorders sums over key blocks and merges by exp/log; that
  moves O(1) results by a few hundred ulps (~1e-14), far below any real mistake.
- float32: atol 2e-6, rtol 1e-5 — PyTorch context parallel's own float32 bar on outputs,
  lse and gradients, both sides computed in float32.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from attnlab.distributed import simulate, spawn, unshard
from attnlab.distributed.comm import DistributedError
from attnlab.torch import scaled_dot_product_attention
from tests.distributed import workers
from tests.support.ring_reference import reference_attention

LAYOUTS = ("contiguous", "zigzag", "striped")
F64 = {"rtol": 0.0, "atol": 1e-12}
F32 = {"rtol": 1e-5, "atol": 2e-6}


def _case(W, layout, is_causal, **extra):
    case = {"world_size": W, "layout": layout, "is_causal": is_causal, "fn": "ring",
            "seed": 100 * W + len(layout) + int(is_causal), "B": 2, "H": 4, "Hkv": 2,
            "T": 2 * W * 3, "D": 8, "Dv": 6, "dtype": "float64", "key_padding": True,
            "pad_last": 2}
    case.update(extra)
    return case


CASES = {}
for W in (1, 2, 3, 4):
    for layout in LAYOUTS:
        for is_causal in (False, True):
            CASES[f"W{W}-{layout}-{'causal' if is_causal else 'full'}-f64-gqa-padding"] = _case(
                W, layout, is_causal)
        CASES[f"W{W}-{layout}-causal-f32"] = _case(W, layout, True, dtype="float32", Hkv=4,
                                                   key_padding=False, T=2 * W * 8, D=16, Dv=16)
    # T = 6W − 1 positions: not a multiple of 2W, so padded to 6W, the padding masked.
    CASES[f"W{W}-zigzag-causal-length-6W-1"] = _case(W, "zigzag", True, real=6 * W - 1,
                                                     pad_last=0)
    CASES[f"W{W}-striped-full-length-6W-1"] = _case(W, "striped", False, real=6 * W - 1,
                                                    pad_last=0)
    # A query with nothing to attend to (its only key is padding): out 0, lse -inf.
    CASES[f"W{W}-zigzag-causal-empty-row"] = _case(W, "zigzag", True, pad_first=True)
for W in (1, 2, 4):
    for layout in ("contiguous", "zigzag"):
        for fn in ("ring", "ulysses"):
            CASES[f"W{W}-{layout}-causal-{fn}-compare"] = _case(
                W, layout, True, fn=fn, H=8, Hkv=4, seed=7)
# The stale-K/V test: the same inputs, one key moved (position 5, on rank 2 of 4 in zigzag).
CASES["W4-zigzag-causal-before"] = _case(4, "zigzag", True, seed=11, key_padding=False)
CASES["W4-zigzag-causal-after"] = _case(4, "zigzag", True, seed=11, key_padding=False,
                                        perturb=(5, 0.5))

BAD = ("mismatched shards", "bad dtype on one rank", "ulysses heads", "ulysses kv heads",
       "odd zigzag", "ring requires_grad on one rank", "ulysses requires_grad on one rank",
       "empty shards")


@pytest.fixture(scope="module")
def runs():
    """{case name: [rank 0's result, …]}, {bad-input kind: [rank 0's error, …]}: one spawn."""
    names = list(CASES)
    # 4 processes import torch on a loaded 2-core machine (tens of seconds); a hang
    # anywhere (a rank left in a collective) fails here instead of stalling the suite.
    per_rank = spawn(workers.run_all, 4, ([CASES[n] for n in names], BAD), timeout=240)
    results = {name: [per_rank[r][0][i] for r in range(CASES[name]["world_size"])]
               for i, name in enumerate(names)}
    errors = {kind: [per_rank[r][1][kind] for r in range(4)] for kind in BAD}
    return results, errors


def _gathered(case, results, name):
    dim = -1 if name == "lse" else -2
    return unshard([r[name] for r in results], layout=case["layout"], dim=dim)


def _single_process(case):
    """out, lse and the gradients of single-process attention (attnlab.torch) on the full
    sequence, in the case's dtype; the padded tail cut off for cases with a real length."""
    dtype = getattr(torch, case["dtype"])
    q, k, v, pad, g_out, g_lse = workers.full_inputs(case)
    T = case.get("real") or case["T"]
    q, k, v, pad = q[..., :T, :], k[..., :T, :], v[..., :T, :], pad[:, :T]
    g_out, g_lse = g_out[..., :T, :], g_lse[..., :T]
    q_t, k_t, v_t = (torch.tensor(x, dtype=dtype, requires_grad=True) for x in (q, k, v))
    group = case["H"] // case["Hkv"]
    k_rep, v_rep = k_t.repeat_interleave(group, 1), v_t.repeat_interleave(group, 1)
    allowed = torch.ones(T, T, dtype=torch.bool)
    if case["is_causal"]:
        allowed = torch.tril(allowed)
    if case.get("key_padding"):
        allowed = allowed & torch.tensor(pad)[:, None, None, :]  # (B, 1, T, T)
    out = scaled_dot_product_attention(q_t, k_rep, v_rep, allowed)  # (B, H, T, Dv)
    scores = (q_t @ k_rep.transpose(-1, -2)) / case["D"] ** 0.5
    lse = torch.logsumexp(scores.masked_fill(~allowed, float("-inf")), dim=-1)  # (B, H, T)
    loss = (out.double() * torch.tensor(g_out)).sum()
    if case["fn"] == "ring":
        loss = loss + (lse.double() * torch.tensor(g_lse)).sum()
    loss.backward()
    return {"out": out.detach().double().numpy(), "lse": lse.detach().double().numpy(),
            "dq": q_t.grad.double().numpy(), "dk": k_t.grad.double().numpy(),
            "dv": v_t.grad.double().numpy()}


@pytest.mark.parametrize("name", [n for n in CASES if not n.endswith("empty-row")])
def test_equals_single_process(runs, name):
    case, results = CASES[name], runs[0][name]
    tol = F64 if case["dtype"] == "float64" else F32
    expected = _single_process(case)
    T = case.get("real") or case["T"]
    names = ("out", "lse", "dq", "dk", "dv") if case["fn"] == "ring" else ("out", "dq", "dk", "dv")
    for key in names:
        got = _gathered(case, results, key)
        np.testing.assert_allclose(got[..., :T, :] if key != "lse" else got[..., :T],
                                   expected[key], **tol, err_msg=f"{name}: {key}")
    assert results[0]["out_dtype"] == f"torch.{case['dtype']}"
    if T < case["T"]:  # padded keys get no gradient; padded queries none either
        for key in ("dq", "dk", "dv"):
            assert not _gathered(case, results, key)[..., T:, :].any(), key


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n]["fn"] == "ring"
                                  and CASES[n]["dtype"] == "float64"])
def test_equals_simulate(runs, name):
    case = CASES[name]
    q, k, v, pad, _, _ = workers.full_inputs(case)
    sim = simulate(q, k, v, world_size=case["world_size"], layout=case["layout"],
                   is_causal=case["is_causal"], key_padding=pad if case["key_padding"] else None)
    got_lse = _gathered(case, runs[0][name], "lse")
    np.testing.assert_allclose(_gathered(case, runs[0][name], "out"), sim.out, **F64)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(sim.lse))
    finite = np.isfinite(sim.lse)
    np.testing.assert_allclose(got_lse[finite], sim.lse[finite], **F64)


@pytest.mark.parametrize("W", [1, 2, 3, 4])
def test_a_query_with_no_key(runs, W):
    name = f"W{W}-zigzag-causal-empty-row"
    case, results = CASES[name], runs[0][name]
    out, lse = _gathered(case, results, "out"), _gathered(case, results, "lse")
    assert (out[0, :, 0] == 0).all() and np.isneginf(lse[0, :, 0]).all()
    q, k, v, pad, _, _ = workers.full_inputs(case)
    ref_out, ref_lse = reference_attention(q, k, v, is_causal=True, key_padding=pad)
    np.testing.assert_allclose(out, ref_out, **F64)
    np.testing.assert_allclose(lse[np.isfinite(ref_lse)], ref_lse[np.isfinite(ref_lse)], **F64)
    assert np.isfinite(_gathered(case, results, "dq")).all()


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n]["fn"] == "ring"])
def test_exchanges_counted(runs, name):
    case = CASES[name]
    W = case["world_size"]
    grad_sends = W if W > 1 else 0
    # Only the Hkv key/value heads travel: a shard is B·Hkv·n·(D + Dv) values, plus
    # B·n bytes of key padding; its dK/dV (in the merge dtype) as many values.
    n, itemsize = case["T"] // W, 8 if case["dtype"] == "float64" else 4
    values = case["B"] * case["Hkv"] * n * (case["D"] + case["Dv"])
    kv_bytes = values * itemsize + (case["B"] * n if case["key_padding"] else 0)
    for rank, result in enumerate(runs[0][name]):
        stats = result["stats"]
        # As ring_attention's module docstring states: W − 1 K/V sends in the forward,
        # W − 1 K/V and W dK/dV sends in the backward (none at all for W = 1).
        assert (stats.forward_kv, stats.backward_kv, stats.backward_grad) == (
            W - 1, W - 1, grad_sends), f"rank {rank}"
        assert stats.bytes_sent == 2 * (W - 1) * kv_bytes + grad_sends * values * itemsize


@pytest.mark.parametrize("W", [1, 2, 4])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_ulysses_equals_ring(runs, W, layout):
    ring = runs[0][f"W{W}-{layout}-causal-ring-compare"]
    ulysses = runs[0][f"W{W}-{layout}-causal-ulysses-compare"]
    case = CASES[f"W{W}-{layout}-causal-ring-compare"]
    # (Their gradients differ: the ring's loss also reads lse. Each is compared with
    # single-process attention's in test_equals_single_process.)
    np.testing.assert_allclose(_gathered(case, ulysses, "out"), _gathered(case, ring, "out"),
                               **F64)
    # 4 all-to-alls forward (q, k, v, out) and 4 backward, per rank
    assert all(r["stats"].all_to_all == 8 for r in ulysses)


def test_backward_uses_each_steps_keys(runs):
    """Moving key 5 must change dq for exactly the queries at positions >= 5 (causal), on
    every rank: a backward that reused stale K/V (its own shard, or step 0's) would leave
    the other ranks' dq untouched while the forward stayed right."""
    case = CASES["W4-zigzag-causal-before"]
    before = _gathered(case, runs[0]["W4-zigzag-causal-before"], "dq")
    after = _gathered(case, runs[0]["W4-zigzag-causal-after"], "dq")
    # Queries before position 5 never see key 5: their dq is the same to the last bit.
    np.testing.assert_array_equal(after[..., :5, :], before[..., :5, :])
    moved = np.abs(after - before).max(axis=(0, 1, 3))  # (T,) per query position
    assert (moved[5:] > 1e-6).all(), moved
    expected = (_single_process(CASES["W4-zigzag-causal-after"])["dq"]
                - _single_process(case)["dq"])
    np.testing.assert_allclose(after - before, expected, **F64)


@pytest.mark.parametrize("kind, message", [
    ("mismatched shards", r"q shape is \(1, 4, 4, 8\) on rank 0 but \(1, 4, 3, 8\) on rank 3"),
    ("bad dtype on one rank", r"k: expected a float tensor"),
    ("ulysses heads", r"H must be a multiple of W, got H = 3"),
    ("ulysses kv heads", r"Hkv must be a multiple of W, got Hkv = 1"),
    ("odd zigzag", r"zigzag layout holds two chunks per rank.*got 3"),
    ("ring requires_grad on one rank", r"requires_grad is True on rank 0 but False on rank 1"),
    ("ulysses requires_grad on one rank",
     r"requires_grad is True on rank 0 but False on rank 1"),
])
def test_bad_input_fails_on_every_rank(runs, kind, message):
    errors = runs[1][kind]
    for rank, error in enumerate(errors):
        assert error is not None and error.startswith("DistributedError"), (rank, error)
        assert re.search(message, error), (rank, error)


def test_empty_shards_give_empty_results_on_every_rank(runs):
    # n = 0 used to fail with "torch.cat(): expected a non-empty list" on every rank.
    assert runs[1]["empty shards"] == [None] * 4


def test_no_process_group():
    q = torch.zeros(1, 2, 4, 8)
    from attnlab.distributed import ring_attention, ulysses_attention

    for fn in (ring_attention, ulysses_attention):
        with pytest.raises(DistributedError, match="torch.distributed is not initialised"):
            fn(q, q, q)
