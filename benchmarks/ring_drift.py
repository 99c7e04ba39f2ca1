"""Drift of ring attention's output as W grows: float32 vs bfloat16 partials, lse vs naive merge.

The question users of ring attention keep asking (ring-flash-attention #42, #67): does
the error grow with the number of ranks? This runs the ring's own arithmetic (the
blocks of ``ring_blocks``, the plain local kernel, the merges) for W = 1 … 8 virtual
ranks in one process (the communication moves data without changing it, so no
processes are needed for the numbers) and measures the max abs error of the output
against float64 attention over the whole sequence, on the same float32 inputs.

Columns:
- float32 partials, merged by attnlab's overflow-free lse merge (float32);
- float32 partials, naive merge (``lse + log(1 + exp(lse_b − lse))``, exp weights);
- bfloat16 partials (each block's output rounded to bfloat16, as fused GPU kernels
  return them; lse float32), merged in float32 by the lse merge;
- bfloat16 partials, naive merge with the running output kept in bfloat16;
- for scale: single-process attention (torch SDPA) on float32 and on bfloat16 inputs.

    .venv/bin/python benchmarks/ring_drift.py                   # T = 1680, H 4, D 64, causal
    .venv/bin/python benchmarks/ring_drift.py --no-causal --layout contiguous
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from attnlab.distributed import ring_blocks, shard, unshard
from attnlab.distributed.local import TorchLocalKernel, merge_partial, naive_merge
from attnlab.errors import AttnlabError


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    """float64 attention over the whole sequence: (B, H, T, D) -> (B, H, T, D)."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])  # (B, H, T, T)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], dtype=bool)), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def virtual_ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, W: int, layout: str,
                 causal: bool, partial: torch.dtype, merge: str) -> np.ndarray:
    """The ring's arithmetic on W virtual ranks; returns the unsharded output (float64)."""
    kernel, scale = TorchLocalKernel(), q.shape[-1] ** -0.5
    T = q.shape[-2]
    n = T // W
    acc_dtype = partial if merge == "naive" else torch.float32
    outs = []
    for r in range(W):
        q_r = shard(q, rank=r, world_size=W, layout=layout).unsqueeze(2)  # (B, H, 1, n, D)
        out = torch.zeros((*q_r.shape[:-1], v.shape[-1]), dtype=acc_dtype)
        lse = torch.full(q_r.shape[:-1], float("-inf"))
        seen = torch.zeros(q_r.shape[:-1], dtype=torch.bool)  # naive: a row's first block
        for step in range(W):
            src = (r - step) % W
            k_s = shard(k, rank=src, world_size=W, layout=layout).unsqueeze(2)
            v_s = shard(v, rank=src, world_size=W, layout=layout).unsqueeze(2)
            for blk in ring_blocks(r, src, n, world_size=W, layout=layout, is_causal=causal):
                part_out, part_lse = kernel.forward(q_r[..., blk.rows, :], k_s[..., blk.cols, :],
                                      v_s[..., blk.cols, :], None, blk.diagonal, scale)
                part_out = part_out.to(partial)  # what a fused kernel would hand back
                if merge == "lse":
                    out[..., blk.rows, :], lse[..., blk.rows] = merge_partial(
                        out[..., blk.rows, :], lse[..., blk.rows], part_out.float(), part_lse)
                else:
                    first = ~seen[..., blk.rows]
                    merged_out, merged_lse = naive_merge(out[..., blk.rows, :],
                                                         lse[..., blk.rows], part_out.to(acc_dtype),
                                                         part_lse)
                    out[..., blk.rows, :] = torch.where(first[..., None], part_out.to(acc_dtype),
                                                        merged_out.to(acc_dtype))
                    lse[..., blk.rows] = torch.where(first, part_lse, merged_lse)
                    seen[..., blk.rows] = True
        outs.append(out.squeeze(2).double())
    return unshard(outs, layout=layout).numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=1680, help="T (default 1680 = lcm(2..16)·2)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layout", default="zigzag")
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--max-world-size", type=int, default=8)
    parser.add_argument("--score-scale", type=float, default=2.0,
                        help="q and k drawn with this std (default 2: peaked softmax rows)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    causal = not args.no_causal
    rng = np.random.default_rng(args.seed)
    shape = (1, args.heads, args.seq, args.head_dim)
    q, k = (args.score_scale * rng.standard_normal(shape, dtype=np.float32) for _ in range(2))
    v = rng.standard_normal(shape, dtype=np.float32)
    expected = reference(q, k, v, causal)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    single = {dtype: torch.nn.functional.scaled_dot_product_attention(
        tq.to(dtype), tk.to(dtype), tv.to(dtype), is_causal=causal).double().numpy()
        for dtype in (torch.float32, torch.bfloat16)}
    print(f"ring drift · B=1 H={args.heads} T={args.seq} D={args.head_dim} · {args.layout} · "
          f"{'causal' if causal else 'no mask'} · q, k ~ N(0, {args.score_scale:g}²), v ~ N(0, 1)"
          f" · max |out − float64 attention|")
    print(f"single-process SDPA: float32 {np.abs(single[torch.float32] - expected).max():.2e}, "
          f"bfloat16 {np.abs(single[torch.bfloat16] - expected).max():.2e}")
    print(f"{'W':>3}  {'f32 lse-merge':>14} {'f32 naive':>11}  {'bf16 lse-merge':>15} "
          f"{'bf16 naive (bf16 acc)':>22}")
    for W in range(1, args.max_world_size + 1):
        try:
            cells = [np.abs(virtual_ring(tq, tk, tv, W, args.layout, causal, partial, merge)
                            - expected).max()
                     for partial in (torch.float32, torch.bfloat16) for merge in ("lse", "naive")]
        except AttnlabError as exc:
            print(f"{W:>3}  skipped: {exc}")
            continue
        print(f"{W:>3}  {cells[0]:>14.2e} {cells[1]:>11.2e}  {cells[2]:>15.2e} {cells[3]:>22.2e}")


if __name__ == "__main__":
    main()
