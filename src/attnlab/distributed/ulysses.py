"""DeepSpeed-Ulysses attention: an all-to-all swaps sequence shards for head shards and back.

Each rank holds a shard of the sequence with every head. One all-to-all per
tensor gives each rank the *whole* sequence for H / W of the heads; attention
runs there with :func:`attnlab.torch.scaled_dot_product_attention` (nothing to
merge: each head sees every key), and one more all-to-all brings the output
back to sequence shards::

    q (B, H, n, D) ──all-to-all──> (B, H/W, T, D) ── attention ──> (B, H/W, T, Dv)
                                                  ──all-to-all──> out (B, H, n, Dv)

The traffic per rank is the shard's q, k, v and output once each (DeepSpeed:
4·n·H·D per link, against ring attention's W − 1 K/V shards), but it needs H
(and Hkv, for grouped-query attention) to be a multiple of W. Autograd: the
all-to-all's backward is the same all-to-all of the gradients, so every call
makes 4 all-to-alls in the forward and 4 in the backward (3 + 1 without grad
for k, v), one ``all_gather`` of the key padding when given.

Dimension legend: B batch, H heads, Hkv key/value heads, T sequence length,
n = T / W the shard length, D head dim, Dv value dim, W world size.
Mask convention: ``key_padding`` bool (B, n), **True = a real token**.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..torch.attention import scaled_dot_product_attention
from ..torch.gqa import repeat_kv
from .comm import CommStats, DistributedError, agree_on_call
from .layouts import Layout, shard, unshard

__all__ = ["ulysses_attention"]


class _AllToAll(torch.autograd.Function):
    """(W, ...) -> (W, ...): slice j goes to rank j; slice i of the result came from rank i."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, stats: CommStats | None) -> torch.Tensor:
        ctx.group, ctx.stats = group, stats
        return _all_to_all(x, group, stats)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        # The adjoint sends each slice's gradient back where the slice came from: the same op.
        return _all_to_all(grad, ctx.group, ctx.stats), None, None


def _all_to_all(x: torch.Tensor, group: Any, stats: CommStats | None) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    if stats is not None:
        stats.all_to_all += 1
        stats.bytes_sent += x.numel() * x.element_size() * (x.shape[0] - 1) // x.shape[0]
    return out


def _to_heads(x: torch.Tensor, W: int, layout: Layout, group: Any,
              stats: CommStats | None) -> torch.Tensor:  # (B, h, n, D) -> (B, h / W, T, D)
    B, h, n, D = x.shape
    parts = x.reshape(B, W, h // W, n, D).transpose(0, 1)  # (W, B, h/W, n, D): part j to rank j
    received = _AllToAll.apply(parts, group, stats)  # (W, B, h/W, n, D): rank i's positions
    return unshard(list(received.unbind(0)), layout=layout)  # (B, h/W, T, D)


def _to_sequence(x: torch.Tensor, W: int, layout: Layout, group: Any,
                 stats: CommStats | None) -> torch.Tensor:  # (B, h/W, T, D) -> (B, h, n, D)
    parts = torch.stack([shard(x, rank=r, world_size=W, layout=layout)
                         for r in range(W)])  # (W, B, h/W, n, D): rank r's positions
    received = _AllToAll.apply(parts, group, stats)  # (W, B, h/W, n, D): rank j's heads
    W_, B, hw, n, D = received.shape
    return received.transpose(0, 1).reshape(B, W_ * hw, n, D)  # (B, h, n, D)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    layout: Layout = "contiguous",
    key_padding: torch.Tensor | None = None,
    scale: float | None = None,
    group: Any = None,
    stats: CommStats | None = None,
) -> torch.Tensor:
    """Attention over a sequence sharded across the ranks of ``group``, by all-to-all.

    Shapes (this rank's shard, n = T / W positions laid out by ``layout``,
    contiguous by default: rank r holds positions r·n … (r+1)·n − 1):
        q            (B, H, n, D)      H a multiple of W
        k            (B, Hkv, n, D)    Hkv divides H and is a multiple of W
        v            (B, Hkv, n, Dv)
        key_padding  bool (B, n), True = a real token; None = all real
        ->           out (B, H, n, Dv), q's dtype

    Equals single-process attention over the full sequence, sharded (the same
    result as :func:`~attnlab.distributed.ring_attention` with the same layout).
    ``is_causal``: a query at position p sees keys at positions <= p.
    Call it on every rank. Bad or mismatched input raises the same
    :class:`~attnlab.distributed.comm.DistributedError` on every rank.
    """
    call = agree_on_call(q, k, v, key_padding, layout=layout, is_causal=is_causal,
                         scale=scale, group=group)
    world_size, layout, is_causal, scale_value = (call.world_size, call.layout, call.is_causal,
                                                  call.scale)
    B, H, n, _ = q.shape
    Hkv = k.shape[1]
    for name, heads, what in (("q", H, "H"), ("k", Hkv, "Hkv")):
        if heads % world_size:  # the same shapes on every rank (agreed): every rank raises
            raise DistributedError(
                f"{name}: Ulysses gives each of the W = {world_size} ranks {what} / W heads, "
                f"so {what} must be a multiple of W, got {what} = {heads}; use ring_attention, "
                f"which has no such rule")
    if layout == "zigzag" and n % 2:
        raise DistributedError(f"q: the zigzag layout holds two chunks per rank, so the shard "
                               f"length n must be even, got {n}")
    W = world_size
    q_heads = _to_heads(q, W, layout, group, stats)  # (B, H/W, T, D)
    k_heads = _to_heads(k, W, layout, group, stats)  # (B, Hkv/W, T, D)
    v_heads = _to_heads(v, W, layout, group, stats)  # (B, Hkv/W, T, Dv)
    group_size = H // Hkv  # query head h reads key/value head h // group_size
    k_heads = repeat_kv(k_heads, group_size)  # (B, H/W, T, D)
    v_heads = repeat_kv(v_heads, group_size)  # (B, H/W, T, Dv)
    mask = None
    if key_padding is not None:
        gathered = [torch.empty_like(key_padding, dtype=torch.uint8) for _ in range(W)]
        dist.all_gather(gathered, key_padding.to(torch.uint8), group=group)
        full = unshard([g.bool() for g in gathered], layout=layout, dim=-1)  # (B, T)
        mask = full[:, None, None, :]  # (B, 1, 1, T)
    out = scaled_dot_product_attention(q_heads, k_heads, v_heads, mask, is_causal=is_causal,
                                       scale=scale_value)  # (B, H/W, T, Dv)
    return _to_sequence(out, W, layout, group, stats)  # (B, H, n, Dv)
