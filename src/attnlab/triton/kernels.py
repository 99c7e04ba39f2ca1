"""The Triton kernels of :func:`attnlab.triton.flash_attention`: forward, δ, dq, dk and dv.

FlashAttention-2 (Dao, 2023) as Triton's fused-attention tutorial writes it,
step for step beside attnlab's NumPy :mod:`attnlab.fast.flash`. Comments name
the matching line of the paper's Algorithm 1 (forward) and Algorithm 2
(backward) as "FA2 a1.L7", "FA2 a2.L14", and the matching step of flash.py.
Algorithm 2 runs its dQ update inside the loop over key blocks (a2.L15, a
read-modify-write of dQᵢ); like the tutorial, dq here has its own kernel that
loops over key blocks instead, so that no two programs write the same rows.

One program computes one tile of the output:

    forward   one block of BLOCK_M queries of one (batch, head): loops over key blocks
    δ         one block of queries: δ = rowsum(dout ⊙ out)
    dq        one block of queries: loops over key blocks
    dk, dv    one block of BLOCK_N keys of one (batch, key/value head): loops over the
              query blocks of every query head that shares it (GQA), so that no two
              programs write the same dk/dv rows and no atomics are needed

Scores are kept in base 2, as in the tutorial and as flash.py does without a
bias: q kᵀ is multiplied by scale·log2(e), so that exp(s − m) = 2^(s·log2 e − m·log2 e)
and the kernel calls the hardware's exp2. The stored per-row statistic is
``lse2 = m + log2(l)``, the log-sum-exp in base 2 (the tutorial's ``M``); the
Python side hands users lse = lse2 · ln 2, the natural log that
:func:`attnlab.merge_partials` and ring attention take.

Masks: a tile that every row of the block may see completely is computed
without masking (``MASKED=False``); only the tiles on the causal diagonal or at
a ragged end (T or S not a multiple of the block) pay for ``tl.where``. Key
padding, when given, is applied to every tile. Causal is bottom-right: query i
sits at S − T + i and sees keys j ≤ i + (S − T) (attnlab's convention).

Layout: q, out, dout, dq (B, H, T, D); k, v, dk, dv (B, Hkv, S, D); lse2, δ
(B, H, T) float32; key padding (B, S) as uint8, 1 = a real token. All
contiguous (the Python side makes them so). Accumulation is always float32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_key_tile(
    base, offs_n, offs_d, S,  # pointer to a (S, D) matrix; (BN,) rows, (D,) columns; S
    HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, TRANSPOSED: tl.constexpr,
):
    """Rows ``offs_n`` of a row-major (S, D) key or value matrix: (BN, D), or (D, BN) when
    TRANSPOSED. With MASKED (a ragged last tile), rows past S load as 0."""
    if TRANSPOSED:
        ptrs = base + offs_n[None, :] * HEAD_DIM + offs_d[:, None]  # (D, BN)
        in_range = offs_n[None, :] < S  # (1, BN)
    else:
        ptrs = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]  # (BN, D)
        in_range = offs_n[:, None] < S  # (BN, 1)
    if MASKED:
        tile = tl.load(ptrs, mask=in_range, other=0.0)
    else:
        tile = tl.load(ptrs)
    return tile


@triton.jit
def _key_range(
    start_m, T, S,  # the block's first query; lengths
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr,
):
    """The keys one block of queries reads, as (n_full, n_hi): tiles [0, n_full) every row
    of the block sees whole (no mask needed), then [n_full, n_hi) the diagonal and ragged
    ones. flash.py's Tiles skips tiles the causal mask removes entirely; here the range
    simply stops at the last key the block's last query may see."""
    causal_offset = S - T
    if IS_CAUSAL:
        n_hi = tl.minimum(S, tl.maximum(start_m + BLOCK_M + causal_offset, 0))
        # Tiles every row of the block sees whole: n0 + BLOCK_N − 1 <= start_m + (S − T).
        n_full = tl.maximum(start_m + causal_offset + 1, 0) // BLOCK_N * BLOCK_N
    else:
        n_hi = S
        n_full = S
    n_full = tl.minimum(n_full, S // BLOCK_N * BLOCK_N)  # ... and that are not ragged
    n_full = tl.minimum(n_full, n_hi)
    return n_full, n_hi


@triton.jit
def _forward_tiles(
    acc, row_sum, row_max,  # running state: (BM, D) f32, (BM,) f32, (BM,) f32
    q,  # (BM, D) this block's queries, in the input dtype
    k_base, v_base, pad_base,  # pointers to this (batch, kv head)'s k, v and padding row
    offs_m, offs_d,  # (BM,) query indices, (D,) feature indices
    n_lo, n_hi,  # the key range [n_lo, n_hi) this call covers, in steps of BLOCK_N
    S, causal_offset, qk_scale,  # S; S − T; scale · log2(e)
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
):
    """The online-softmax loop over key blocks (FA2 a1.L6–L10; flash_tiles.online_softmax)."""
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # (BN,)
        # FA2 a1.L7: load Kⱼ, Vⱼ from HBM to on-chip SRAM. k is read transposed, (D, BN).
        # Rows past S (a ragged last tile) load as 0 and are masked below.
        k_t = _load_key_tile(k_base, offs_n, offs_d, S, HEAD_DIM, MASKED, True)  # (D, BN)
        v = _load_key_tile(v_base, offs_n, offs_d, S, HEAD_DIM, MASKED, False)  # (BN, D)
        # FA2 a1.L8: Sᵢʲ = Qᵢ Kⱼᵀ (scaled); flash.py: s = q kⱼᵀ · scale, with log2(e) folded
        # in as flash.py's ScoreUnits does for base 2. float32 accumulation in the dot.
        scores = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale  # (BM, BN) base-2 units
        if MASKED:
            # flash.py's Tiles.blocked: entries not allowed get -inf (weight 0).
            allowed = offs_n[None, :] < S  # (1, BN) keys that exist
            if IS_CAUSAL:
                # bottom-right: query i sees key j iff j <= i + (S − T)
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
            scores = tl.where(allowed, scores, float("-inf"))  # (BM, BN)
        if HAS_PADDING:
            real = tl.load(pad_base + offs_n, mask=offs_n < S, other=0)  # (BN,) 1 = real token
            scores = tl.where(real[None, :] != 0, scores, float("-inf"))  # (BM, BN)
        # FA2 a1.L9: mᵢʲ = max(mᵢʲ⁻¹, rowmax(Sᵢʲ)), P̃ᵢʲ = exp(Sᵢʲ − mᵢʲ),
        #            ℓᵢʲ = e^(mᵢʲ⁻¹ − mᵢʲ) ℓᵢʲ⁻¹ + rowsum(P̃ᵢʲ); flash.py: m_new, p, l.
        new_max = tl.maximum(row_max, tl.max(scores, 1))  # (BM,)
        # A row that has seen only masked keys so far has max -inf: shift by 0 instead,
        # so that exp2(-inf - 0) = 0 rather than exp2(-inf + inf) = NaN.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # (BM,)
        p = tl.math.exp2(scores - shift[:, None])  # (BM, BN) masked entries -> 0
        alpha = tl.math.exp2(row_max - shift)  # (BM,) e^(m_old − m_new); 0 while m_old = -inf
        row_sum = row_sum * alpha + tl.sum(p, 1)  # (BM,)
        # FA2 a1.L10: Oᵢʲ = diag(e^(mᵢʲ⁻¹ − mᵢʲ)) Oᵢʲ⁻¹ + P̃ᵢʲ Vⱼ; flash.py: acc·exp(m − m_new)
        # + p vⱼ. P is rounded to the input dtype for the tensor-core dot (FlashAttention's
        # choice too); the sum stays float32.
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)  # (BM, D)
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def flash_forward_kernel(
    Q, K, V, OUT, LSE2, PAD,  # pointers; LSE2 (B·H, T) float32; PAD (B, S) uint8 or unused
    qk_scale, T, S, H, GROUP,  # scale · log2(e); lengths; query heads; H / Hkv
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
):
    """FA2 Algorithm 1 for one query block Qᵢ of one (batch, head); flash.py's forward_part."""
    start_m = tl.program_id(0) * BLOCK_M  # FA2 a1.L3: "for 1 ≤ i ≤ T_r" (in parallel)
    bh = tl.program_id(1)  # batch · H + head
    b = bh // H
    kv_head = b * (H // GROUP) + (bh % H) // GROUP  # GQA: GROUP query heads share a kv head
    offs_m = start_m + tl.arange(0, BLOCK_M)  # (BM,)
    offs_d = tl.arange(0, HEAD_DIM)  # (D,)
    q_base = Q + bh.to(tl.int64) * T * HEAD_DIM
    k_base = K + kv_head.to(tl.int64) * S * HEAD_DIM
    v_base = V + kv_head.to(tl.int64) * S * HEAD_DIM
    pad_base = PAD + b.to(tl.int64) * S
    # FA2 a1.L4: load Qᵢ from HBM to on-chip SRAM. Rows past T load as 0 and are not stored.
    q = tl.load(q_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                mask=offs_m[:, None] < T, other=0.0)  # (BM, D)
    # FA2 a1.L5: Oᵢ⁽⁰⁾ = 0, ℓᵢ⁽⁰⁾ = 0, mᵢ⁽⁰⁾ = -inf; flash.py's acc, l, m.
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)

    causal_offset = S - T
    n_full, n_hi = _key_range(start_m, T, S, BLOCK_M, BLOCK_N, IS_CAUSAL)
    # FA2 a1.L6: "for 1 ≤ j ≤ T_c", in two runs: whole tiles, then the diagonal/ragged ones.
    acc, row_sum, row_max = _forward_tiles(
        acc, row_sum, row_max, q, k_base, v_base, pad_base, offs_m, offs_d, 0, n_full,
        S, causal_offset, qk_scale, HEAD_DIM, BLOCK_N, False, IS_CAUSAL, HAS_PADDING, PRECISION)
    acc, row_sum, row_max = _forward_tiles(
        acc, row_sum, row_max, q, k_base, v_base, pad_base, offs_m, offs_d, n_full, n_hi,
        S, causal_offset, qk_scale, HEAD_DIM, BLOCK_N, True, IS_CAUSAL, HAS_PADDING, PRECISION)

    # FA2 a1.L12: Oᵢ = diag(ℓᵢ)⁻¹ Oᵢ; flash.py: out = acc / l. A row with nothing to attend
    # to has ℓ = 0 (and acc = 0): divide by 1 to give 0, flash.py's safe_sum.
    empty = row_sum == 0.0  # (BM,)
    out = acc / tl.where(empty, 1.0, row_sum)[:, None]  # (BM, D)
    # FA2 a1.L13: Lᵢ = mᵢ + log(ℓᵢ), kept in base 2; -inf for an empty row (flash.py's lse).
    lse2 = tl.where(empty, float("-inf"), row_max + tl.math.log2(tl.where(empty, 1.0, row_sum)))
    # FA2 a1.L14–15: write Oᵢ and Lᵢ to HBM.
    row_ok = offs_m < T
    tl.store(OUT + bh.to(tl.int64) * T * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
             out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE2 + bh.to(tl.int64) * T + offs_m, lse2, mask=row_ok)


@triton.jit
def flash_delta_kernel(
    OUT, DOUT, DELTA, T,  # OUT, DOUT (B·H, T, D); DELTA (B·H, T) float32
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """FA2 a2.L4: Dᵢ = rowsum(dOᵢ ∘ Oᵢ), the tutorial's _attn_bwd_preprocess.

    flash.py's backward computes δ = Σ_S P ⊙ dP / Σ_S P instead, from the P and
    dP tiles it keeps for each block of queries. Equal in exact arithmetic; see
    flash_attention_backward in attnlab.triton.flash for why this kernel takes
    FlashAttention-2's form.
    """
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BM,)
    bh = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = bh.to(tl.int64) * T * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    row_ok = offs_m[:, None] < T
    out = tl.load(OUT + rows, mask=row_ok, other=0.0).to(tl.float32)  # (BM, D)
    dout = tl.load(DOUT + rows, mask=row_ok, other=0.0).to(tl.float32)  # (BM, D)
    tl.store(DELTA + bh.to(tl.int64) * T + offs_m, tl.sum(out * dout, 1), mask=offs_m < T)


@triton.jit
def _dq_tiles(
    dq, q, dout, lse2, delta,  # dq (BM, D) f32; q, dout (BM, D); lse2, delta (BM,) f32
    k_base, v_base, pad_base, offs_m, offs_d, n_lo, n_hi, S, causal_offset, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
):
    """dq of one query block over key blocks (FA2 a2.L6–L15, the dQᵢ update)."""
    for n0 in range(n_lo, n_hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)  # (BN,)
        # FA2 a2.L6: load Kⱼ, Vⱼ (both transposed here, (D, BN)).
        k_t = _load_key_tile(k_base, offs_n, offs_d, S, HEAD_DIM, MASKED, True)  # (D, BN)
        v_t = _load_key_tile(v_base, offs_n, offs_d, S, HEAD_DIM, MASKED, True)  # (D, BN)
        # FA2 a2.L10: Sᵢʲ = Qᵢ Kⱼᵀ; a2.L11: Pᵢʲ = exp(Sᵢʲ − Lᵢ), rebuilt from the stored
        # lse as flash.py's tile_weights does (base 2 throughout, so no rounding of units).
        scores = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale  # (BM, BN)
        p = tl.math.exp2(scores - lse2[:, None])  # (BM, BN) P
        if MASKED:
            allowed = offs_n[None, :] < S
            if IS_CAUSAL:
                allowed = allowed & (offs_n[None, :] <= offs_m[:, None] + causal_offset)
            p = tl.where(allowed, p, 0.0)
        if HAS_PADDING:
            real = tl.load(pad_base + offs_n, mask=offs_n < S, other=0)  # (BN,)
            p = tl.where(real[None, :] != 0, p, 0.0)
        # FA2 a2.L13: dPᵢʲ = dOᵢ Vⱼᵀ; flash.py: dscores = dout vᵀ.
        dp = tl.dot(dout, v_t, input_precision=PRECISION)  # (BM, BN)
        # FA2 a2.L14: dSᵢʲ = Pᵢʲ ∘ (dPᵢʲ − Dᵢ); flash.py: dz = P ⊙ (dP − δ).
        ds = p * (dp - delta[:, None])  # (BM, BN)
        # FA2 a2.L15: dQᵢ ← dQᵢ + τ dSᵢʲ Kⱼ (τ, the scale, applied once at the end).
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=PRECISION)  # (BM, D)
    return dq


@triton.jit
def flash_dq_kernel(
    Q, K, V, DOUT, LSE2, DELTA, DQ, PAD,
    qk_scale, scale, T, S, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
):
    """dQᵢ for one query block of one (batch, head): the tutorial's _attn_bwd_dq."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // H
    kv_head = b * (H // GROUP) + (bh % H) // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = bh.to(tl.int64) * T * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    row_ok = offs_m < T
    # FA2 a2.L9: load Qᵢ, dOᵢ, Lᵢ, Dᵢ. Rows past T: q = dout = 0, and lse2 = +inf so that
    # their P = 2^(s − inf) = 0. An empty row (lse -inf) gets +inf too: it passes no
    # gradient, as in flash.py.
    q = tl.load(Q + rows, mask=row_ok[:, None], other=0.0)  # (BM, D)
    dout = tl.load(DOUT + rows, mask=row_ok[:, None], other=0.0)  # (BM, D)
    lse2 = tl.load(LSE2 + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=float("inf"))
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)  # (BM,)
    delta = tl.load(DELTA + bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)  # (BM,)
    k_base = K + kv_head.to(tl.int64) * S * HEAD_DIM
    v_base = V + kv_head.to(tl.int64) * S * HEAD_DIM
    pad_base = PAD + b.to(tl.int64) * S
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    causal_offset = S - T
    n_full, n_hi = _key_range(start_m, T, S, BLOCK_M, BLOCK_N, IS_CAUSAL)  # the forward's
    dq = _dq_tiles(dq, q, dout, lse2, delta, k_base, v_base, pad_base, offs_m, offs_d, 0,
                   n_full, S, causal_offset, qk_scale, HEAD_DIM, BLOCK_N, False, IS_CAUSAL,
                   HAS_PADDING, PRECISION)
    dq = _dq_tiles(dq, q, dout, lse2, delta, k_base, v_base, pad_base, offs_m, offs_d, n_full,
                   n_hi, S, causal_offset, qk_scale, HEAD_DIM, BLOCK_N, True, IS_CAUSAL,
                   HAS_PADDING, PRECISION)
    # flash.py: dq *= scale (the dot gave dz k). FA2 a2.L15: write dQᵢ to HBM.
    tl.store(DQ + rows, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _dkdv_tiles(
    dk, dv, k, v, p_real,  # dk, dv (BN, D) f32; k, v (BN, D); p_real (BN,) 1 = real key
    q_base, dout_base, lse2_base, delta_base, offs_n, offs_d, m_lo, m_hi, T, causal_offset,
    qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASKED: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
):
    """dk, dv of one key block over the query blocks of one head (FA2 a2.L8–L17, transposed)."""
    for m0 in range(m_lo, m_hi, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)  # (BM,)
        row_ok = offs_m < T
        # FA2 a2.L9: load Qᵢ (transposed, (D, BM)), dOᵢ, Lᵢ, Dᵢ. Rows past T: lse2 = +inf,
        # so their P is 0 (no mask needed on them); an empty row's -inf becomes +inf too.
        q_t = tl.load(q_base + offs_m[None, :] * HEAD_DIM + offs_d[:, None],
                      mask=row_ok[None, :], other=0.0)  # (D, BM)
        dout = tl.load(dout_base + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                       mask=row_ok[:, None], other=0.0)  # (BM, D)
        lse2 = tl.load(lse2_base + offs_m, mask=row_ok, other=float("inf"))  # (BM,)
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2)
        delta = tl.load(delta_base + offs_m, mask=row_ok, other=0.0)  # (BM,)
        # FA2 a2.L10, L11: Pᵀ = exp(K Qᵀ − Lᵀ), the transpose of flash.py's tile_weights.
        scores_t = tl.dot(k, q_t, input_precision=PRECISION) * qk_scale  # (BN, BM)
        p_t = tl.math.exp2(scores_t - lse2[None, :])  # (BN, BM)
        if MASKED:
            if IS_CAUSAL:
                p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_offset, p_t, 0.0)
        if HAS_PADDING:
            p_t = tl.where(p_real[:, None] != 0, p_t, 0.0)
        # FA2 a2.L12: dVⱼ ← dVⱼ + Pᵀ dOᵢ; flash.py: dv += Pᵀ dout.
        dv = tl.dot(p_t.to(dout.dtype), dout, dv, input_precision=PRECISION)  # (BN, D)
        # FA2 a2.L13: dPᵀ = Vⱼ dOᵢᵀ; a2.L14: dSᵀ = Pᵀ ∘ (dPᵀ − Dᵢᵀ); flash.py's dz, transposed.
        dp_t = tl.dot(v, tl.trans(dout), input_precision=PRECISION)  # (BN, BM)
        ds_t = p_t * (dp_t - delta[None, :])  # (BN, BM)
        # FA2 a2.L16: dKⱼ ← dKⱼ + τ dSᵀ Qᵢ (τ applied once at the end); flash.py: dk += dzᵀ q.
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def flash_dkdv_kernel(
    Q, K, V, DOUT, LSE2, DELTA, DK, DV, PAD,
    qk_scale, scale, T, S, H, GROUP,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, HAS_PADDING: tl.constexpr, PRECISION: tl.constexpr,
):
    """dKⱼ, dVⱼ for one key block of one (batch, kv head): FA2 a2.L5–L19, the tutorial's
    _attn_bwd_dkdv, summed over the GROUP query heads that share the kv head (GQA)."""
    start_n = tl.program_id(0) * BLOCK_N  # FA2 a2.L5: "for 1 ≤ j ≤ T_c" (in parallel)
    bkv = tl.program_id(1)  # batch · Hkv + kv head
    Hkv = H // GROUP
    b = bkv // Hkv
    offs_n = start_n + tl.arange(0, BLOCK_N)  # (BN,)
    offs_d = tl.arange(0, HEAD_DIM)
    kv_rows = bkv.to(tl.int64) * S * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    key_ok = offs_n < S
    # FA2 a2.L6: load Kⱼ, Vⱼ; a2.L7: dKⱼ = dVⱼ = 0. Keys past S load as 0; their rows of
    # dk and dv are never stored, and each row's sums involve that key alone.
    k = tl.load(K + kv_rows, mask=key_ok[:, None], other=0.0)  # (BN, D)
    v = tl.load(V + kv_rows, mask=key_ok[:, None], other=0.0)  # (BN, D)
    if HAS_PADDING:
        p_real = tl.load(PAD + b.to(tl.int64) * S + offs_n, mask=key_ok, other=0)  # (BN,)
    else:
        p_real = key_ok.to(tl.uint8)  # (BN,) unused: every key is real
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    causal_offset = S - T
    if IS_CAUSAL:
        # Queries that see any key of the block: i + (S − T) >= start_n.
        m_lo = tl.maximum(start_n - causal_offset, 0) // BLOCK_M * BLOCK_M
        # ... and blocks whose every row sees every key: m0 >= start_n + BN − 1 − (S − T).
        first_full = tl.maximum(start_n + BLOCK_N - 1 - causal_offset, 0)
        m_full = tl.minimum((first_full + BLOCK_M - 1) // BLOCK_M * BLOCK_M, T)
        m_full = tl.maximum(m_full, m_lo)
    else:
        m_lo = 0
        m_full = 0
    for g in range(0, GROUP):  # FA2 a2.L8: "for 1 ≤ i ≤ T_r", for each head sharing Kⱼ, Vⱼ
        bh = b * H + (bkv % Hkv) * GROUP + g
        q_base = Q + bh.to(tl.int64) * T * HEAD_DIM
        dout_base = DOUT + bh.to(tl.int64) * T * HEAD_DIM
        lse2_base = LSE2 + bh.to(tl.int64) * T
        delta_base = DELTA + bh.to(tl.int64) * T
        dk, dv = _dkdv_tiles(dk, dv, k, v, p_real, q_base, dout_base, lse2_base, delta_base,
                             offs_n, offs_d, m_lo, m_full, T, causal_offset, qk_scale,
                             HEAD_DIM, BLOCK_M, True, IS_CAUSAL, HAS_PADDING, PRECISION)
        dk, dv = _dkdv_tiles(dk, dv, k, v, p_real, q_base, dout_base, lse2_base, delta_base,
                             offs_n, offs_d, m_full, T, T, causal_offset, qk_scale,
                             HEAD_DIM, BLOCK_M, False, IS_CAUSAL, HAS_PADDING, PRECISION)
    # flash.py: dk *= scale. FA2 a2.L18: write dKⱼ, dVⱼ.
    tl.store(DK + kv_rows, (dk * scale).to(DK.dtype.element_ty), mask=key_ok[:, None])
    tl.store(DV + kv_rows, dv.to(DV.dtype.element_ty), mask=key_ok[:, None])
