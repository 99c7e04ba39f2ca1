"""A fused fast path for a stack of post-LN BERT blocks, in reused float32 buffers.

:func:`fused_encoder` computes what ``for block in blocks: x = block(x, mask=mask)``
computes, for blocks that :func:`fusable` accepts; its plain twin is the
per-block forward of :class:`attnlab.nn.layers.EncoderBlock`, which
:meth:`attnlab.models.BertModel.forward` falls back to (and which the tests
compare it with).

Dimension legend: B batch, H heads, T tokens, S keys, E hidden width,
F intermediate width, D head width, N = B·T rows.
"""

from __future__ import annotations

import math

import numpy as np

from ..fast.varlen import attend_packed
from ..masked_softmax import stable_softmax
from ..nn.layers import EncoderBlock, layer_norm_inplace
from ..nn.multihead import linear
from ..special import gelu_erf

__all__ = ["fusable", "fused_encoder", "fused_encoder_packed", "softmax_by_blocks"]


def fusable(block: EncoderBlock) -> bool:
    """Whether :func:`fused_encoder` computes exactly this block (as BertModel builds them):
    post-LN, exact GELU, float32, no RoPE / ALiBi / GQA / own scale, dropout off, and the
    :class:`EncoderBlock` forward itself (a subclass that changes it computes something
    else). Hook points are not here: :class:`attnlab.models.BertModel` also leaves the
    fused path when a hook is attached, or when its ``fused`` option is False."""
    attn, ffn = block.attn, block.ffn
    arrays = (attn.Wq, attn.Wk, attn.Wv, attn.Wo, attn.bq, attn.bk, attn.bv, attn.bo,
              ffn.W1, ffn.b1, ffn.W2, ffn.b2,
              block.norm1.gamma, block.norm1.beta, block.norm2.gamma, block.norm2.beta)
    return (isinstance(block, EncoderBlock) and type(block).forward is EncoderBlock.forward
            and block.norm == "post"
            and not (block.dropout.training and block.dropout.p > 0)
            and attn.rope is None and not attn.alibi and attn.scale is None
            and attn.num_kv_heads == attn.num_heads
            and attn.head_dim == attn.value_head_dim and ffn.activation == "gelu"
            and all(a is not None and a.dtype == np.float32 for a in arrays))


def fused_encoder(blocks: list[EncoderBlock], x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Post-LN BERT blocks with exact GELU on float32 x, in buffers reused by every block.

    Shapes: x (B, T, E) float32, mask bool (B, 1, 1, T) with True = a real key
    (may be attended), or None -> (B, T, E). Efficient implementation equivalent
    to the following (and tested against it), for blocks that :func:`fusable`
    accepts::

        for block in blocks:
            x = block(x, mask=mask)   # LN2(h + FFN(h)), h = LN1(x + MHA(x, mask))

    What changes is where results go and how rows are summed: one set of
    (B·T, E), (B·T, F) and (B, H, T, T) buffers for the whole stack instead of
    fresh arrays for every intermediate of every block (a fresh multi-megabyte
    array costs a page fault per 4 KiB the first time it is written), bias and
    GELU applied in place, LayerNorm's and the softmax's row sums as BLAS
    matrix-vector products (:func:`~attnlab.nn.layers.layer_norm_inplace`,
    :func:`softmax_by_blocks`), and no re-validation of already-checked arrays
    between blocks. The results agree with the blocks' to float32 rounding.
    """
    B, T, E = x.shape
    H = blocks[0].attn.num_heads
    D = E // H
    F = blocks[0].ffn.W1.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))  # as scaled_dot_product_attention
    # Blocked keys get -inf before the softmax, as np.copyto(scores, -inf, where=~mask).
    key_bias = None if mask is None else np.where(mask, np.float32(0.0), np.float32(-np.inf))
    rows = np.array(x, dtype=np.float32).reshape(B * T, E)  # (N, E): the running hidden state
    q, k, v, heads, h = np.empty((5, B * T, E), dtype=np.float32)  # (N, E) each
    scores = np.empty((B, H, T, T), dtype=np.float32)  # (B, H, T, S), S = T
    hidden = np.empty((B * T, F), dtype=np.float32)  # (N, F)
    for block in blocks:
        attn = block.attn
        for out, w, b in ((q, attn.Wq, attn.bq), (k, attn.Wk, attn.bk), (v, attn.Wv, attn.bv)):
            linear(rows, w, b, out=out)  # (N, E)
        q_heads, k_heads, v_heads = (
            a.reshape(B, T, H, D).transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, H, T, D)
        for exact in (False, True):
            np.matmul(q_heads, k_heads.transpose(0, 1, 3, 2), out=scores)  # (B, H, T, S)
            scores *= scale
            if key_bias is not None:
                scores += key_bias  # (B, H, T, S)
            if exact:  # rare: some row lies far below its block's maximum
                stable_softmax(scores, in_place=True)  # (B, H, T, S) weights
            elif softmax_by_blocks(scores):
                break
        # weights @ V written straight into the merged-heads layout.
        np.matmul(scores, v_heads, out=heads.reshape(B, T, H, D).transpose(0, 2, 1, 3))
        _block_rest(block, heads, rows, h, hidden)
    return rows.reshape(B, T, E)


def _block_rest(block: EncoderBlock, heads: np.ndarray, rows: np.ndarray, h: np.ndarray,
                hidden: np.ndarray) -> None:
    """A post-LN block after attention, in place: heads (N, E) merged head outputs,
    rows (N, E) the block's input, overwritten with its output; h (N, E) and hidden
    (N, F) scratch."""
    attn, ffn = block.attn, block.ffn
    linear(heads, attn.Wo, attn.bo, out=h)  # (N, E)
    h += rows  # residual; dropout is the identity in evaluation mode
    layer_norm_inplace(h, block.norm1.gamma, block.norm1.beta, block.norm1.eps)
    linear(h, ffn.W1, None, out=hidden)  # (N, F)
    gelu_erf(hidden, ffn.b1, out=hidden)  # GELU(h W1 + b1), in place
    linear(hidden, ffn.W2, ffn.b2, out=rows)  # (N, E); the block's input is spent
    rows += h  # residual
    layer_norm_inplace(rows, block.norm2.gamma, block.norm2.beta, block.norm2.eps)


def fused_encoder_packed(
    blocks: list[EncoderBlock], x: np.ndarray, cu_seqlens: np.ndarray
) -> np.ndarray:
    """:func:`fused_encoder` on sequences packed without padding: x (N, E) float32 -> (N, E).

    ``cu_seqlens`` (B + 1,) int64, checked: sequence b is rows cu_seqlens[b] :
    cu_seqlens[b + 1]. Every projection, LayerNorm and feed-forward runs on the
    N real rows only (no padding rows at all); attention is
    :func:`attnlab.fast.varlen.attend_packed`, each sequence over its own keys,
    which is exactly what the padding mask gives a padded batch. Efficient
    implementation equivalent to the following (and tested against it)::

        for b in range(B):
            rows = slice(cu_seqlens[b], cu_seqlens[b + 1])
            for block in blocks:
                x[rows] = block(x[None, rows])[0]   # the sequence alone, no mask
    """
    N, E = x.shape
    H = blocks[0].attn.num_heads
    D = E // H
    F = blocks[0].ffn.W1.shape[1]
    scale = 1.0 / math.sqrt(D)  # as scaled_dot_product_attention
    rows = np.array(x, dtype=np.float32)  # (N, E): the running hidden state
    q, k, v, heads, h = np.empty((5, N, E), dtype=np.float32)  # (N, E) each
    hidden = np.empty((N, F), dtype=np.float32)  # (N, F)
    for block in blocks:
        attn = block.attn
        for out, w, b in ((q, attn.Wq, attn.bq), (k, attn.Wk, attn.bk), (v, attn.Wv, attn.bv)):
            linear(rows, w, b, out=out)  # (N, E)
        # (N, E) is already the packed (N, H, D) layout: heads are contiguous columns.
        attend_packed(q.reshape(N, H, D), k.reshape(N, H, D), v.reshape(N, H, D), cu_seqlens,
                      cu_seqlens, scale, False, out=heads.reshape(N, H, D))
        _block_rest(block, heads, rows, h, hidden)
    return rows


#: A row whose exponentials (shifted by its block's maximum) sum to less than this
#: has its maximum more than ~46 below the block's: its smaller weights could
#: reach float32's subnormal range, so the row-by-row softmax is used instead.
_SMALLEST_ROW_SUM = 1e-20


def softmax_by_blocks(scores: np.ndarray) -> bool:
    """Softmax over the last axis in place, each row shifted by its (b, h) block's maximum.

    Shapes: scores (B, H, T, S). Softmax is unchanged by any constant shift of a
    row; one maximum per (T, S) block replaces T row maxima, and the row sums are
    one matrix-vector product: NumPy reductions and broadcasts over rows of S ~ 30
    cost ~5x more than a pass over the same data (the overhead is per row). A
    block whose keys are all masked (-inf) gives zeros, as the row-wise softmax.

    Returns False, with ``scores`` spoilt, if a row's maximum is so far below its
    block's that its small weights would lose precision: recompute the scores
    and use :func:`attnlab.masked_softmax.stable_softmax`.
    """
    B, H, T, S = scores.shape
    top = scores.reshape(B * H, T * S).max(axis=1)  # (B·H,) block maxima
    dead = np.isneginf(top)  # (B·H,): every key masked
    top[dead] = 0.0  # avoid -inf - -inf
    scores -= top.reshape(B, H, 1, 1)
    np.exp(scores, out=scores)
    sums = scores.reshape(-1, S) @ np.ones(S, dtype=scores.dtype)  # (B·H·T,) row sums
    dead_rows = np.repeat(dead, T)  # (B·H·T,)
    if (sums[~dead_rows] < _SMALLEST_ROW_SUM).any():
        return False
    sums[dead_rows] = 1.0  # nothing to attend to: leave the zeros
    # Dividing by a (B, H, T, 1) array would again loop per row: expand it instead.
    scores *= np.repeat(1.0 / sums, S).reshape(B, H, T, S)
    return True
