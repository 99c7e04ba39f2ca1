"""Ring attention on torch.distributed: K/V shards rotate around the ranks, partials merge by lse.

Each of the W ranks holds a shard of the sequence (laid out by ``layout``, see
:mod:`~attnlab.distributed.layouts`) and computes attention of its queries over
the whole sequence (Liu et al., Ring Attention, 2023)::

    out, lse = 0, -inf                              (B, H, T/W, Dv), (B, H, T/W) float32
    for step s = 0 … W−1:                           K/V of rank src = (rank − s) mod W
        start sending the K/V shard held to rank + 1, receiving from rank − 1
        for each block of ring_blocks(rank, src):   causal blocks that see nothing skipped
            o, l = local_kernel.forward(q[rows], k[cols], v[cols])
            out, lse = merge_partial(out, lse, o, l)        overflow-free, in float32
        wait for the exchange; the received shard is held next

The exchange (``batch_isend_irecv``) runs while the step computes. Only the
Hkv key/value heads travel (grouped-query attention). The backward is a custom
autograd function that replays the ring: each block's weights are rebuilt from
the final lse, dq stays home, and each shard's dK/dV travel with it around the
ring, gathering every rank's contribution, and arrive back at their owner.

Exchanges per rank (:class:`~attnlab.distributed.comm.CommStats`, for W > 1):
the forward W − 1 K/V sends; the backward W − 1 K/V sends and W dK/dV sends
(the last one brings each shard's gradient home). W = 1 sends nothing.

Dimension legend: B batch, H heads, Hkv key/value heads, T sequence length,
n = T / W the shard length, D head dim, Dv value dim, W world size.
Mask convention: ``key_padding`` bool (B, n), **True = a real token**.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .comm import (
    CommStats,
    DistributedError,
    agree_on_call,
    exchange,
    ring_peers,
    wait_all,
)
from .layouts import Layout, ring_blocks
from .local import LocalKernel, TorchLocalKernel, accumulate_dtype, merge_partial

__all__ = ["ring_attention"]


@dataclass(frozen=True)
class _Ring:
    """The checked settings of one call, shared by its forward and backward."""

    rank: int
    world_size: int
    group: Any
    peers: tuple[int, int]
    layout: Layout
    is_causal: bool
    scale: float
    kernel: LocalKernel
    stats: CommStats | None

    def blocks(self, step: int, n: int) -> tuple[int, list[Any]]:
        src = (self.rank - step) % self.world_size
        return src, ring_blocks(self.rank, src, n, world_size=self.world_size,
                                layout=self.layout, is_causal=self.is_causal)

    def count(self, kind: str, tensors: list[torch.Tensor]) -> None:
        if self.stats is not None:
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            self.stats.bytes_sent += sum(t.numel() * t.element_size() for t in tensors)


def _travelling(k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor | None) -> list[torch.Tensor]:
    """The tensors a K/V shard is sent as (key padding as uint8: gloo sends no bool)."""
    return [k, v] if pad is None else [k, v, pad.to(torch.uint8)]


def _held(received: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    return received[0], received[1], (received[2].bool() if len(received) > 2 else None)


def _forward(ring: _Ring, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             pad: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, Hkv, G, n, D), k (B, Hkv, 1, n, D), v (B, Hkv, 1, n, Dv), pad (B, n)
    -> out (B, Hkv, G, n, Dv), lse (B, Hkv, G, n), in accumulate_dtype."""
    n, work = q.shape[-2], accumulate_dtype(q.dtype)
    out = torch.zeros((*q.shape[:-1], v.shape[-1]), dtype=work, device=q.device)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=work, device=q.device)
    held = (k, v, pad)
    for step in range(ring.world_size):
        requests: list[Any] = []
        if step < ring.world_size - 1:  # pass the shard on while computing with it
            sent = _travelling(*held)
            received, requests = exchange(sent, ring.peers, ring.group)
            ring.count("forward_kv", sent)
        _, blocks = ring.blocks(step, n)
        k_now, v_now, pad_now = held
        started = time.perf_counter()
        for blk in blocks:
            part_out, part_lse = ring.kernel.forward(
                q[..., blk.rows, :], k_now[..., blk.cols, :], v_now[..., blk.cols, :],
                None if pad_now is None else pad_now[:, blk.cols], blk.diagonal, ring.scale)
            out[..., blk.rows, :], lse[..., blk.rows] = merge_partial(
                out[..., blk.rows, :], lse[..., blk.rows], part_out, part_lse)
        computed = time.perf_counter()
        if requests:
            wait_all(requests)
            held = _held(received)
        if ring.stats is not None:
            ring.stats.step_compute_s.append(computed - started)
            ring.stats.step_wait_s.append(time.perf_counter() - computed)
    return out, lse


def _backward(ring: _Ring, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              pad: torch.Tensor | None, lse: torch.Tensor, dout: torch.Tensor,
              delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ring replayed: dq stays, each shard's dK/dV travel with it and come back home.

    Shapes as in :func:`_forward`; lse, delta (B, Hkv, G, n); dout (B, Hkv, G, n, Dv)
    -> dq (B, Hkv, G, n, D), dk (B, Hkv, 1, n, D), dv (B, Hkv, 1, n, Dv) in accumulate_dtype.
    """
    n, work = q.shape[-2], accumulate_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=work, device=q.device)
    held = (k, v, pad)
    grads: list[torch.Tensor] = []  # dK, dV of the shard held, with what other ranks added
    grad_requests: list[Any] = []
    grad_received: list[torch.Tensor] = []
    for step in range(ring.world_size):
        kv_requests: list[Any] = []
        if step < ring.world_size - 1:
            sent = _travelling(*held)
            kv_received, kv_requests = exchange(sent, ring.peers, ring.group)
            ring.count("backward_kv", sent)
        _, blocks = ring.blocks(step, n)
        k_now, v_now, pad_now = held
        dk_part = torch.zeros(k_now.shape, dtype=work, device=q.device)  # (B, Hkv, 1, n, D)
        dv_part = torch.zeros(v_now.shape, dtype=work, device=q.device)  # (B, Hkv, 1, n, Dv)
        for blk in blocks:
            dq_blk, dk_blk, dv_blk = ring.kernel.backward(
                q[..., blk.rows, :], k_now[..., blk.cols, :], v_now[..., blk.cols, :],
                None if pad_now is None else pad_now[:, blk.cols], blk.diagonal, ring.scale,
                dout[..., blk.rows, :], lse[..., blk.rows], delta[..., blk.rows])
            dq[..., blk.rows, :] += dq_blk
            dk_part[..., blk.cols, :] += dk_blk
            dv_part[..., blk.cols, :] += dv_blk
        if grad_requests:  # the previous rank's dK/dV of the shard held now
            wait_all(grad_requests)
            dk_part += grad_received[0]
            dv_part += grad_received[1]
        grads = [dk_part, dv_part]
        if ring.world_size > 1:  # on to the next rank; after the last step, home
            grad_received, grad_requests = exchange(grads, ring.peers, ring.group)
            ring.count("backward_grad", grads)
        if kv_requests:
            wait_all(kv_requests)
            held = _held(kv_received)
    if grad_requests:
        wait_all(grad_requests)
        grads = grad_received
    return dq, grads[0], grads[1]


class _RingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                pad: torch.Tensor | None, ring: _Ring) -> tuple[torch.Tensor, torch.Tensor]:
        B, H, n, _ = q.shape
        Hkv = k.shape[1]
        q5 = q.reshape(B, Hkv, H // Hkv, n, q.shape[-1])  # (B, Hkv, G, n, D)
        k5, v5 = k.unsqueeze(2), v.unsqueeze(2)  # (B, Hkv, 1, n, D), (B, Hkv, 1, n, Dv)
        out, lse = _forward(ring, q5, k5, v5, pad)
        ctx.save_for_backward(q5, k5, v5, out, lse)
        ctx.pad, ctx.ring = pad, ring
        return (out.reshape(B, H, n, -1).to(q.dtype), lse.reshape(B, H, n))

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor, dlse: torch.Tensor | None) -> Any:
        q5, k5, v5, out, lse = ctx.saved_tensors
        work = out.dtype
        dout5 = dout.reshape(out.shape).to(work)  # (B, Hkv, G, n, Dv)
        # δ = rowsum(dout ⊙ out); a gradient reaching lse adds P ⊙ dlse to dS = P ⊙ (dP − δ).
        delta = (dout5 * out).sum(dim=-1)  # (B, Hkv, G, n)
        if dlse is not None:
            delta = delta - dlse.reshape(lse.shape).to(work)
        dq, dk, dv = _backward(ctx.ring, q5, k5, v5, ctx.pad, lse, dout5, delta)
        B, Hkv, G, n, D = q5.shape
        return (dq.reshape(B, Hkv * G, n, D).to(q5.dtype), dk.squeeze(2).to(k5.dtype),
                dv.squeeze(2).to(v5.dtype), None, None)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    layout: Layout = "zigzag",
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    group: Any = None,
    return_lse: bool = False,
    local_kernel: LocalKernel | None = None,
    stats: CommStats | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over a sequence sharded across the ranks of ``group``; call it on every rank.

    Shapes (this rank's shard, n = T / W positions laid out by ``layout``):
        q            (B, H, n, D)
        k            (B, Hkv, n, D)    Hkv divides H (query head h reads K/V head
                                       h // (H / Hkv)); only these heads travel
        v            (B, Hkv, n, Dv)
        key_padding  bool (B, n), True = a real token; None = all real
        ->           out (B, H, n, Dv) in q's dtype, and lse (B, H, n) in float32
                     (float64 for float64 inputs) if ``return_lse``

    Equals single-process attention over the full sequence, sharded:
    ``shard(sdpa(Q, K, V, is_causal=...), rank=rank, layout=layout)`` where Q, K,
    V are the unsharded tensors (:func:`~attnlab.distributed.unshard`), with
    the key padding as mask. ``is_causal``: a query at position p sees keys at
    positions <= p; blocks that see nothing are skipped, and the ``"zigzag"`` and
    ``"striped"`` layouts give every rank the same work (``"contiguous"`` gives
    the last rank ~2W times the first's). Sequence lengths that do not divide
    into W (2W for zigzag) shards: pad to
    :func:`~attnlab.distributed.padded_length` and pass ``key_padding`` False on
    the padding. A query with no key to attend to gets out 0 and lse -inf.

    Autograd: gradients reach q, k and v (not key_padding), also through the
    returned lse. Exchanges per rank: see :mod:`attnlab.distributed.ring`;
    ``stats`` (a :class:`~attnlab.distributed.comm.CommStats`) counts them.

    ``local_kernel``: what computes each block (the seam for a fused CUDA or
    Triton kernel, see :class:`~attnlab.distributed.local.LocalKernel`);
    default the plain :class:`~attnlab.distributed.local.TorchLocalKernel`.
    Partial results merge in float32 (float64 for float64) whatever the input
    dtype. Works on any backend with point-to-point sends: gloo (CPU), NCCL (GPU).

    Checks: every rank checks its shards, then the ranks compare them (one small
    ``all_gather_object``): an error on any rank, or shards that differ across
    ranks, raise the same :class:`~attnlab.distributed.comm.DistributedError`
    on every rank instead of leaving the others waiting.
    """
    call = agree_on_call(q, k, v, key_padding, layout=layout, is_causal=is_causal,
                         scale=scale, group=group, flags={"return_lse": return_lse})
    rank, world_size, layout, is_causal = call.rank, call.world_size, call.layout, call.is_causal
    scale_value, return_lse = call.scale, call.flags["return_lse"]
    n = q.shape[-2]
    if layout == "zigzag" and n % 2:
        # Every rank sees the same n (agreed above), so every rank raises this.
        raise DistributedError(f"q: the zigzag layout holds two chunks per rank, so the shard "
                           f"length n must be even, got {n}")
    if n == 0:  # empty shards on every rank (agreed): nothing to compute or send
        B, H = q.shape[:2]
        connect = (q.sum() + k.sum() + v.sum()) * 0  # 0, so that gradients reach q, k, v
        out = q.new_zeros((B, H, 0, v.shape[-1])) + connect  # (B, H, 0, Dv)
        lse = torch.full((B, H, 0), float("-inf"), dtype=accumulate_dtype(q.dtype),
                         device=q.device) + connect.to(accumulate_dtype(q.dtype))  # (B, H, 0)
        return (out, lse) if return_lse else out
    ring = _Ring(rank, world_size, group, ring_peers(rank, world_size, group), layout,
                 is_causal, scale_value, local_kernel or TorchLocalKernel(), stats)
    pad = None if key_padding is None else key_padding.contiguous()
    out, lse = _RingFunction.apply(q.contiguous(), k.contiguous(), v.contiguous(), pad, ring)
    return (out, lse) if return_lse else out
