"""Ring and Ulysses attention on GPUs with NCCL (or on CPU with gloo): correctness and time.

Launch one process per GPU with torchrun; every rank builds the same random inputs
from the seed, keeps its shard, and runs :func:`attnlab.distributed.ring_attention`
(each layout) and :func:`attnlab.distributed.ulysses_attention`, forward and
backward. Checked against single-process attention over the full sequence
(``F.scaled_dot_product_attention`` on each rank's device, then sharded):
float32 to PyTorch context parallel's bar (atol 2e-6, rtol 1e-5; TF32 is turned off),
bfloat16 to its bf16 bound (atol 8e-3·W, rtol 1e-3·W). Then times the median of
``--repeats`` forward + backward calls. Prints on rank 0; exits 1 if a check fails.

    torchrun --nproc-per-node 8 benchmarks/ring_nccl.py --seq 131072 --heads 32 --kv-heads 8
    torchrun --nproc-per-node 2 benchmarks/ring_nccl.py --backend gloo --seq 512   # CPU check
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnlab.distributed import ring_attention, shard, ulysses_attention


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, W = dist.get_rank(), dist.get_world_size()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device = torch.device("cpu")
    H, Hkv = args.heads, args.kv_heads or args.heads
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    full = [torch.randn(args.batch, h, args.seq, args.head_dim, generator=gen)
            for h in (H, Hkv, Hkv)]
    failures = 0

    def report(text: str) -> None:
        if rank == 0:
            print(text, flush=True)

    report(f"W = {W} · {args.backend} · B={args.batch} H={H} Hkv={Hkv} T={args.seq} "
           f"D={args.head_dim}")
    for dtype, tol in ((torch.float32, (2e-6, 1e-5)), (torch.bfloat16, (8e-3 * W, 1e-3 * W))):
        q, k, v = (x.to(device, dtype).detach().clone().requires_grad_() for x in full)
        group = H // Hkv
        expected = F.scaled_dot_product_attention(
            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), is_causal=True)
        g_out = torch.randn(expected.shape, generator=gen).to(device, dtype)
        expected.backward(g_out)
        cases = [(f"ring {layout}", layout) for layout in ("contiguous", "zigzag", "striped")]
        cases.append(("ulysses", "contiguous"))
        for name, layout in cases:
            if name == "ulysses" and (H % W or Hkv % W):
                report(f"  {dtype} {name}: skipped (heads not a multiple of W)")
                continue

            def mine(x: torch.Tensor, layout: str = layout) -> torch.Tensor:
                return shard(x.detach(), rank=rank, world_size=W, layout=layout).contiguous()

            lq, lk, lv = (mine(x).requires_grad_() for x in (q, k, v))
            fn = ring_attention if name.startswith("ring") else ulysses_attention
            g_local = mine(g_out)

            def call(fn=fn, lq=lq, lk=lk, lv=lv, layout=layout, g=g_local) -> torch.Tensor:
                out = fn(lq, lk, lv, is_causal=True, layout=layout)
                out.backward(g)
                return out

            out = call()
            worst = 0.0
            for got, want in ((out, mine(expected)), (lq.grad, mine(q.grad)),
                              (lk.grad, mine(k.grad)), (lv.grad, mine(v.grad))):
                ok = torch.allclose(got.float(), want.float(), atol=tol[0], rtol=tol[1])
                failures += 0 if ok else 1
                worst = max(worst, float((got.detach().float() - want.float()).abs().max()))
            times = []
            for _ in range(args.repeats):
                lq.grad = lk.grad = lv.grad = None
                if device.type == "cuda":
                    torch.cuda.synchronize()
                dist.barrier()
                started = time.perf_counter()
                call()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - started)
            median_ms = 1e3 * statistics.median(times)
            report(f"  {str(dtype):<15} {name:<16} max error {worst:.2e} "
                   f"(atol {tol[0]:g}) · forward + backward {median_ms:.1f} ms")
    count = torch.tensor([failures], device=device)
    dist.all_reduce(count)  # every rank's failed checks
    failures = int(count.item())
    dist.destroy_process_group()
    report("all checks passed" if failures == 0 else f"{failures} checks failed")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    np.seterr(all="raise")
    sys.exit(main())
