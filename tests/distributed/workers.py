"""Functions the spawned ranks run (module level, so the child processes can import them).

Every rank builds the same full-sequence inputs from a seed, takes its shard, runs the
distributed function with gradients, and returns its shards of the results as NumPy
arrays; the test process unshards them and compares with single-process attention.
"""

from __future__ import annotations

import numpy as np
import torch

from attnlab.distributed import ring_attention, shard, ulysses_attention
from attnlab.distributed.comm import CommStats
from attnlab.errors import AttnlabError


def full_inputs(case):
    """q (B, H, T, D), k, v (B, Hkv, T, D|Dv), key padding (B, T), and the upstream
    gradients g_out (B, H, T, Dv), g_lse (B, H, T), from the case's seed."""
    rng = np.random.default_rng(case["seed"])
    B, H, Hkv, T, D, Dv = (case[key] for key in ("B", "H", "Hkv", "T", "D", "Dv"))
    q = rng.standard_normal((B, H, T, D))
    k = rng.standard_normal((B, Hkv, T, D))
    v = rng.standard_normal((B, Hkv, T, Dv))
    pad = np.ones((B, T), dtype=bool)
    if case.get("real") is not None:  # the real length; the rest is padding
        pad[:, case["real"]:] = False
    if case.get("pad_last"):
        pad[-1, -case["pad_last"]:] = False
    g_out = rng.standard_normal((B, H, T, Dv))
    g_lse = rng.standard_normal((B, H, T))
    if case.get("real") is not None:  # the padded queries' results are thrown away
        g_out[:, :, case["real"]:] = 0.0
        g_lse[:, :, case["real"]:] = 0.0
    if case.get("pad_first"):  # batch 0's first key is padding: under is_causal its
        pad[0, 0] = False  # first query sees nothing (out 0, lse -inf)
        g_lse[0, :, 0] = 0.0
    if case.get("perturb") is not None:  # move one key: (position, amount)
        position, amount = case["perturb"]
        k[:, :, position, :] += amount
    return q, k, v, pad, g_out, g_lse


def run_case(rank, world_size, case, group=None):
    """One case on this rank: its shards of out, lse, dq, dk, dv, and the exchange counts."""
    dtype = getattr(torch, case["dtype"])
    q, k, v, pad, g_out, g_lse = full_inputs(case)
    layout = case["layout"]

    def mine(x, dim=-2):
        return torch.from_numpy(np.ascontiguousarray(
            shard(x, rank=rank, world_size=world_size, layout=layout, dim=dim)))

    q_t, k_t, v_t = (mine(x).to(dtype).requires_grad_() for x in (q, k, v))
    pad_t = mine(pad, dim=-1) if case.get("key_padding") else None
    stats = CommStats()
    if case["fn"] == "ring":
        out, lse = ring_attention(q_t, k_t, v_t, is_causal=case["is_causal"], layout=layout,
                                  key_padding=pad_t, return_lse=True, stats=stats,
                                  group=group)
        loss = (out.double() * mine(g_out)).sum() + (lse.double() * mine(g_lse, -1)).sum()
    else:
        out = ulysses_attention(q_t, k_t, v_t, is_causal=case["is_causal"], layout=layout,
                                key_padding=pad_t, stats=stats, group=group)
        lse = None
        loss = (out.double() * mine(g_out)).sum()
    loss.backward()
    result = {name: t.detach().double().numpy() for name, t in
              (("out", out), ("dq", q_t.grad), ("dk", k_t.grad), ("dv", v_t.grad))}
    result["lse"] = None if lse is None else lse.detach().double().numpy()
    result["stats"] = stats
    result["out_dtype"] = str(out.dtype)
    return result


def run_all(rank, world_size, cases, bad_kinds):
    """Every case, each on a group of its own world size (ranks 0 … W − 1 of this world,
    the default group for the whole world), then every kind of bad input on the whole world.

    Returns ({case index: result}, {kind: error message or None}) for this rank.
    """
    import torch.distributed as dist

    groups = {W: dist.new_group(list(range(W))) for W in range(1, world_size)}  # every rank
    results = {}
    for index, case in enumerate(cases):
        W = case["world_size"]
        if rank < W:
            results[index] = run_case(rank, W, case, groups.get(W))
    errors = {kind: bad_inputs(rank, world_size, kind) for kind in bad_kinds}
    return results, errors


def bad_inputs(rank, world_size, kind):
    """Call with inputs that are wrong on some rank; return the error each rank raised."""
    q = torch.zeros(1, 4, 4, 8)
    try:
        if kind == "mismatched shards":  # the last rank's shard is one position shorter
            n = 3 if rank == world_size - 1 else 4
            q = torch.zeros(1, 4, n, 8)
            ring_attention(q, q, q, layout="contiguous")
        elif kind == "bad dtype on one rank":
            k = q.to(torch.int64) if rank == 0 else q
            ring_attention(q, k, q, layout="contiguous")
        elif kind == "ulysses heads":
            q = torch.zeros(1, 3, 4, 8)
            ulysses_attention(q, q, q)
        elif kind == "ulysses kv heads":
            ulysses_attention(torch.zeros(1, 4, 4, 8), torch.zeros(1, 1, 4, 8),
                              torch.zeros(1, 1, 4, 8))
        elif kind == "odd zigzag":
            q = torch.zeros(1, 4, 3, 8)
            ring_attention(q, q, q, layout="zigzag")
        elif kind in ("ring requires_grad on one rank", "ulysses requires_grad on one rank"):
            # Rank 0 alone would go on into the backward and wait there for its peers
            # (until one exits): refused before starting. The backward is not run here.
            fn = ring_attention if kind.startswith("ring") else ulysses_attention
            fn(q.clone().requires_grad_(rank == 0), q, q, layout="contiguous")
        elif kind == "empty shards":  # n = 0 on every rank: empty results, gradients too
            for layout in ("zigzag", "contiguous"):
                q = torch.zeros(1, 4, 0, 8, requires_grad=True)
                kv = torch.zeros(1, 2, 0, 8, requires_grad=True)
                out, lse = ring_attention(q, kv, kv, layout=layout, return_lse=True)
                (out.sum() + lse.sum()).backward()
                shapes = (tuple(out.shape), tuple(lse.shape), tuple(q.grad.shape),
                          tuple(kv.grad.shape))
                if shapes != ((1, 4, 0, 8), (1, 4, 0), (1, 4, 0, 8), (1, 2, 0, 8)):
                    return f"wrong shapes {shapes}"
        else:
            raise ValueError(kind)
    except AttnlabError as exc:
        return f"{type(exc).__name__}: {exc}"
    except (RuntimeError, ValueError) as exc:  # not a clear error: reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return None
