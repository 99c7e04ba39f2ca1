"""The work of one rank in one ring step, in torch: a block's partial attention and its merge.

A rank's queries meet one visiting K/V shard at a time. For each block of that
tile (:func:`~attnlab.distributed.layouts.ring_blocks`) the local kernel gives
the partial result over those keys only, ``(out, lse)``, and
:func:`merge_partial` folds it into the running result by log-sum-exp, in the
overflow-free form of PyTorch's context parallel and ring-flash-attention::

    out ← out − σ(lse_b − lse) · (out − out_b)
    lse ← max(lse, lse_b) − log σ(|lse − lse_b|)      (= log(e^lse + e^lse_b))

(never exp of an lse, which overflows float32 at 88). The backward of a block
rebuilds its weights from the *final* lse, as FlashAttention-2 does:
P = exp(s − lse), dP = dout vᵀ, dS = P ⊙ (dP − δ) with δ = rowsum(dout ⊙ out).

:class:`LocalKernel` is the seam: anything with these two methods can compute
the blocks (a fused CUDA or Triton kernel that returns a natural-log lse);
:class:`TorchLocalKernel` is the plain one: its forward is attnlab.torch's own
attention (:func:`attnlab.torch.kernel.attend` with ``return_lse=True``, the
function behind :func:`attnlab.torch.scaled_dot_product_attention`), its backward
a few torch ops, both cut into blocks of query rows so that no more than
``block_q`` × (T/W) scores per batch-head are held at once.

Grouped-query attention: q is viewed as (B, Hkv, G, R, D) with G = H / Hkv and
k, v as (B, Hkv, 1, C, D), so the matmuls broadcast over the group and the K/V
heads are never copied; dk and dv are summed over the group.

Dimension legend: B batch, H heads, Hkv key/value heads, G = H / Hkv, R block
rows (queries), C block columns (keys), D head dim, Dv value dim.
Mask convention: ``key_padding`` bool (B, C), True = a real token.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from ..torch.kernel import attend

__all__ = ["LocalKernel", "TorchLocalKernel", "accumulate_dtype", "merge_partial", "naive_merge"]

#: Query rows per chunk of the plain kernel: its scores are (B, H, 1024, C) at once.
DEFAULT_BLOCK_Q = 1024


def accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype partial results are merged in: float32, or float64 for float64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class LocalKernel(Protocol):
    """What computes one block of a ring step. Shapes (G = H / Hkv):

    forward(q (B, Hkv, G, R, D), k (B, Hkv, 1, C, D), v (B, Hkv, 1, C, Dv),
            key_padding bool (B, C) | None, diagonal, scale)
        -> out (B, Hkv, G, R, Dv), lse (B, Hkv, G, R), both in accumulate_dtype(q.dtype)

    backward(q, k, v, key_padding, diagonal, scale, dout (B, Hkv, G, R, Dv),
             lse (B, Hkv, G, R), delta (B, Hkv, G, R))
        -> dq (B, Hkv, G, R, D), dk (B, Hkv, 1, C, D), dv (B, Hkv, 1, C, Dv)

    ``diagonal``: R == C and row a sees column b only if b <= a. ``lse`` is the
    final (merged) log-sum-exp of the rows; ``delta`` is rowsum(dout ⊙ out)
    minus the gradient reaching lse. A row with nothing to attend to has lse -inf
    and gets out 0 and no gradient.
    """

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        key_padding: torch.Tensor | None, diagonal: bool, scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def backward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        key_padding: torch.Tensor | None, diagonal: bool, scale: float,
        dout: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...


class TorchLocalKernel:
    """The plain local kernel: attnlab.torch's attention forward, a plain torch backward.

    Computed in ``accumulate_dtype`` (float16 and bfloat16 inputs in float32);
    ``block_q`` query rows at a time.
    """

    def __init__(self, block_q: int = DEFAULT_BLOCK_Q) -> None:
        self.block_q = block_q

    def _scores(
        self, q: torch.Tensor, k: torch.Tensor, key_padding: torch.Tensor | None,
        diagonal: bool, scale: float, r0: int,
    ) -> torch.Tensor:  # (B, Hkv, G, r, D), (B, Hkv, 1, C, D) -> (B, Hkv, G, r, C)
        # In place from here on: a chunk's scores are the kernel's largest array, and
        # nothing needs them unscaled or unmasked (no autograd runs through this kernel).
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # (B, Hkv, G, r, C)
        if diagonal:
            rows = torch.arange(r0, r0 + q.shape[-2], device=q.device)[:, None]  # (r, 1)
            cols = torch.arange(k.shape[-2], device=q.device)[None, :]  # (1, C)
            scores.masked_fill_(cols > rows, float("-inf"))  # (B, Hkv, G, r, C)
        if key_padding is not None:
            scores.masked_fill_(~key_padding[:, None, None, None, :], float("-inf"))
        return scores

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        key_padding: torch.Tensor | None, diagonal: bool, scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        work = accumulate_dtype(q.dtype)
        q, k, v = q.to(work), k.to(work), v.to(work)
        outs, lses = [], []
        allowed = None if key_padding is None else key_padding[:, None, None, None, :]
        for r0 in range(0, q.shape[-2], self.block_q):
            r1 = min(r0 + self.block_q, q.shape[-2])
            # On the diagonal, columns past the chunk's last row are all masked: keys
            # :r1 only, and attnlab's bottom-right is_causal puts row i at r0 + i.
            c1 = r1 if diagonal else k.shape[-2]
            out, lse = attend(q[..., r0:r1, :], k[..., :c1, :], v[..., :c1, :],
                              None if allowed is None else allowed[..., :c1], None, scale,
                              is_causal=diagonal, return_lse=True)  # attnlab.torch's plain path
            outs.append(out)  # (B, Hkv, G, r, Dv)
            lses.append(lse)  # (B, Hkv, G, r); -inf: no key
        return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)

    def backward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        key_padding: torch.Tensor | None, diagonal: bool, scale: float,
        dout: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        work = accumulate_dtype(q.dtype)
        q, k, v, dout = q.to(work), k.to(work), v.to(work), dout.to(work)
        dk = torch.zeros(k.shape, dtype=work, device=k.device)  # (B, Hkv, 1, C, D)
        dv = torch.zeros(v.shape, dtype=work, device=v.device)  # (B, Hkv, 1, C, Dv)
        dqs = []
        for r0 in range(0, q.shape[-2], self.block_q):
            r1 = min(r0 + self.block_q, q.shape[-2])
            c1 = r1 if diagonal else k.shape[-2]  # on the diagonal, later columns are masked
            q_blk, dout_blk = q[..., r0:r1, :], dout[..., r0:r1, :]
            k_blk, v_blk = k[..., :c1, :], v[..., :c1, :]
            pad = None if key_padding is None else key_padding[:, :c1]
            scores = self._scores(q_blk, k_blk, pad, diagonal, scale, r0)  # (.., r, c1)
            shift = torch.where(torch.isneginf(lse[..., r0:r1]), float("inf"),
                                lse[..., r0:r1])[..., None]  # (B, Hkv, G, r, 1)
            weights = scores.sub_(shift).exp_()  # (B, Hkv, G, r, c1): P from the final lse
            dscores = torch.matmul(dout_blk, v_blk.transpose(-1, -2))  # (.., r, c1) dP
            dscores.sub_(delta[..., r0:r1, None]).mul_(weights)  # dS = P ⊙ (dP − δ)
            # The group axis G is summed for the K/V heads it shares (GQA).
            dv[..., :c1, :] += torch.matmul(weights.transpose(-1, -2), dout_blk).sum(
                dim=2, keepdim=True)
            dk[..., :c1, :] += torch.matmul(dscores.transpose(-1, -2), q_blk).sum(
                dim=2, keepdim=True) * scale
            dqs.append(torch.matmul(dscores, k_blk) * scale)  # (B, Hkv, G, r, D)
        return torch.cat(dqs, dim=-2), dk, dv


def merge_partial(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold a block's partial result into the running one, by log-sum-exp, without overflow.

    Shapes: out, block_out (..., R, Dv); lse, block_lse (..., R) -> the same. Both
    sides in one float dtype (float32 or float64). A side with lse -inf (no key
    yet) contributes nothing; both -inf gives out 0, lse -inf.
    """
    empty = torch.isneginf(lse) & torch.isneginf(block_lse)  # (..., R) neither has a key
    diff = torch.where(empty, 0.0, block_lse - lse)  # (..., R), ±inf when one side is empty
    out = out - torch.sigmoid(diff)[..., None] * (out - block_out)  # (..., R, Dv)
    out = out.masked_fill(empty[..., None], 0.0)  # no key on either side: 0, as everywhere
    lse = torch.maximum(lse, block_lse) - F.logsigmoid(diff.abs())  # (..., R)
    return out, lse


def naive_merge(
    out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge as first written in ring-flash-attention, in the partials' own dtype:
    lse + log(1 + exp(lse_b − lse)), which overflows once lse_b − lse > 88 in float32.
    For the drift benchmark only (compare :func:`merge_partial`)."""
    new_lse = lse + torch.log(1 + torch.exp(block_lse - lse))  # (..., R)
    out = (torch.exp(lse - new_lse)[..., None] * out
           + torch.exp(block_lse - new_lse)[..., None] * block_out)  # (..., R, Dv)
    return out, new_lse
