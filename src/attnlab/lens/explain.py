"""``explain``: run self-attention step by step and keep every matrix, up to a whole layer.

The default is seed 000's worked example: three words of four dims,

    X = [[1, 0, 1, 0],   # word 1
         [0, 2, 0, 2],   # word 2
         [1, 1, 1, 1]]   # word 3

with random 4×3 projections Wq, Wk, Wv drawn from a fixed seed (standard
normal, as the seed's ``np.random.randn(4, 3)``), so every run prints the same
numbers.

A trace is a cache with formulas. The attention is the real block's: explain builds an
:class:`attnlab.MultiHeadAttention` from these weights (with its RoPE and its scale;
without Wo, Wo = I and the block's output is not read), runs it under
:func:`attnlab.lens.run_with_cache`, and reads Q, K, V, the rotated Q and K, the scores
the softmax reads, the weights and each head's output at its hook points. The steps no
block has a hook for (Q·Kᵀ before the scaling, the scaled scores before the mask, the
fused layout's Q_all) are their formula applied to those cached values. Options add what
seed 001's layer adds around it (positions, the output projection Wo, the residual,
LayerNorm) and switch off what the seeds teach by contrast (the 1/√d_k scaling).
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

import numpy as np

from ..checks import (
    as_float_array,
    check_alloc,
    check_flag,
    check_positive_int,
    check_scale,
    check_text,
    shape_str,
)
from ..errors import AttnlabError, ShapeError
from ..init import as_rng, init_weight
from ..kernel import (
    MAX_SCORE_ELEMENTS,
    PLAIN_PATH_HINT,
    check_key_padding,
    check_mask_and_bias,
)
from ..messages import msg
from ..nn.heads import merge_heads
from ..nn.layers import LayerNorm
from ..nn.multihead import MultiHeadAttention
from ..positional import LearnedPositionalEmbedding, sinusoidal_encoding
from ..positional_relative import RotaryEmbedding
from ..shapes import check_score_elements
from ..trace import Step, Trace
from .cache import run_with_cache
from .explain_notes import head_notes, layer_notes

__all__ = ["explain", "POSITIONS", "SEED_000_X", "SPLITS", "token_embeddings"]

#: The positional encodings ``explain(pos=...)`` can add.
POSITIONS = ("none", "sinusoidal", "learned", "rope")
#: The two multi-head layouts of the seed articles (the same computation, two ways of
#: writing it): seed 000's "per_head" and seed 001's "fused".
SPLITS = ("per_head", "fused")
#: The former names of the layouts (deprecated, warn): a split named "seed001" read
#: like a random seed beside ``seed=``.
FORMER_SPLITS = {"seed000": "per_head", "seed001": "fused"}

#: The hook points of the block that a trace reads (hook_rot_q/k only with RoPE).
_READ = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_scores",
         "hook_pattern", "hook_z")

#: Seed 000's input: 3 words × 4 dims.
SEED_000_X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=np.float64)


def token_embeddings(tokens: list[str], d_model: int = 4) -> np.ndarray:
    """A deterministic toy embedding per token: (T,) -> (T, E).

    The same token always gets the same vector (seeded by a CRC32 of its UTF-8
    text, not Python's per-process ``hash``), drawn from a standard normal. It
    is for demonstrations: it carries no meaning.

    >>> E = token_embeddings(["小明", "去了", "小明"])
    >>> E.shape, bool((E[0] == E[2]).all())
    ((3, 4), True)
    """
    tokens = _check_tokens(tokens)
    if not tokens:
        raise AttnlabError("tokens: expected at least one token, got none")
    E = check_positive_int(d_model, "d_model")
    check_alloc((len(tokens), E), np.float64, "the embeddings (T, E)", "d_model")
    rows = [np.random.default_rng(zlib.crc32(t.encode("utf-8"))).standard_normal(E)
            for t in tokens]
    return np.stack(rows)  # (T, E)


def _check_tokens(tokens: Any) -> list[str]:
    """``tokens`` as a list of labels (each str()-ed); a bare string is refused, not split."""
    if isinstance(tokens, str):
        raise AttnlabError(
            f"tokens: expected a list of tokens, got the string {tokens!r}; "
            "split it first, e.g. text.split()"
        )
    try:
        return [check_text(str(t), f"tokens[{i}]") for i, t in enumerate(tokens)]
    except TypeError:
        raise AttnlabError(
            f"tokens: expected a list of tokens, got {type(tokens).__name__}"
        ) from None


def explain(
    X: Any = None,
    *,
    tokens: list[str] | None = None,
    Wq: Any = None,
    Wk: Any = None,
    Wv: Any = None,
    Wo: Any = None,
    d_k: int | None = None,
    d_model: int = 4,
    num_heads: int = 1,
    mask: Any = None,
    key_padding: Any = None,
    is_causal: bool = False,
    scale: float | None = None,
    pos: str = "none",
    residual: bool = False,
    norm: str | None = None,
    split: str = "per_head",
    seed: int = 0,
    scheme: str = "normal",
) -> Trace:
    """Self-attention on ``X`` with every intermediate recorded, up to a whole layer.

    Shapes:
        X        (T, E); default seed 000's (3, 4), or ``token_embeddings(tokens,
                 d_model)`` (T, d_model) when only ``tokens`` are given
        tokens   T labels (default "word1".., which the report shows as 单词1.. in Chinese)
        Wq, Wk, Wv  (E, H*d_k) — head h uses columns h*d_k:(h+1)*d_k
        Wo       (H*d_k, E_out), or True to draw one of (H*d_k, E); without it the
                 heads are just concatenated (seed 000's multi_head_attention)
        mask     bool, broadcastable to (T, T); True = may attend
        key_padding  bool (T,), True = a real token, False = padding (no one attends to it)
        -> Trace with steps X [, pe, embedded] [, normed_in] Wq, Wk, Wv [, Q_all, K_all,
           V_all], then per head Q, K, V [, Q_rope, K_rope], scores [, scaled] [, masked],
           weights, output, then [concat] [, Wo, projected] [, residual] [, normed].

    Options:
        scale     None: 1/√d_k (the seeds); a number: that factor; 1.0: no scaling, to
                  see why the seeds scale (the softmax saturates as d_k grows).
        pos       "none" | "sinusoidal" (seed 001's table, added to X) | "learned" (an
                  untrained table of N(0, 0.02²), added to X) | "rope" (Q and K rotated
                  per head; needs an even d_k).
        residual  add the layer's input back: x + attention(x) (needs E_out = E).
        norm      "post": LayerNorm(x + attention(x)) (seed 001's code);
                  "pre": x + attention(LayerNorm(x)). Either implies ``residual``.
        split     "per_head": each head takes its own columns of Wq (seed 000's
                  ``E × H·d_k`` layout, one projection per head); "fused": one
                  projection of width E = H·d_k, then ``.view(T, H, d_k).transpose``
                  (seed 001's ``d_model / h`` split; d_k defaults to E // H). The two
                  are the same computation: head h reads the same columns. The
                  former names "seed000" and "seed001" still work (deprecated, warn).

    Formula, for each head h (Wq_h = Wq[:, h*d_k:(h+1)*d_k], likewise Wk_h, Wv_h)::

        Q, K, V = X·Wq_h, X·Wk_h, X·Wv_h           (T, d_k) each
        scores  = Q·Kᵀ                             (T, T)
        scaled  = scores × scale                   (scale = 1/√d_k by default)
        masked  = where(allowed, scaled, -∞)      (only with a mask, padding or causal)
        weights = softmax(masked or scaled, axis=-1)   each row sums to 1
        output  = weights·V                        (T, d_k)

    then concat = [output_1 | … | output_H] (T, H*d_k), projected = concat·Wo,
    residual = x + projected, normed = LayerNorm(residual) (post-LN).

    ``trace.meta["notes"]`` lists what a learner should know about this run, as data
    (``{"kind": ..., "head": ..., ...}``; :mod:`attnlab.report` words them): random
    weights mean nothing (``untrained``); identical input rows that attention cannot
    tell apart without positions (``same_rows``); a saturated softmax
    (``saturated``) and whether seed 000's softmax, written without the max
    subtraction, gives NaN on this input (``naive_overflow``); near-uniform weights
    (``near_uniform``); rows with nothing to attend to (``fully_masked``); scaling off
    (``scaling_off``).

    Weights not given are drawn from ``seed`` with ``scheme`` ("normal" = the
    seeds' ``randn``; "xavier"; "xavier_normal").

    >>> trace = explain()
    >>> [s.key for s in trace][:6]
    ['X', 'Wq', 'Wk', 'Wv', 'Q', 'K']
    >>> trace.get("weights").values.sum(axis=-1).round(6).tolist()
    [1.0, 1.0, 1.0]
    >>> causal = explain(tokens=["小明", "去了", "学校"], num_heads=2, is_causal=True)
    >>> causal.get("weights", head=1).values.shape, causal.output.shape
    ((3, 3), (3, 6))
    >>> layer = explain(num_heads=2, split="fused", Wo=True, norm="post")
    >>> [s.key for s in layer][-4:], layer.output.shape
    (['Wo', 'projected', 'residual', 'normed'], (3, 4))

    Print it with :func:`attnlab.report.to_text`, save it with :func:`attnlab.report.save`.
    """
    H = check_positive_int(num_heads, "num_heads")
    if split in FORMER_SPLITS:
        warnings.warn(f"explain(split={split!r}) is deprecated: say "
                      f"split={FORMER_SPLITS[split]!r}", DeprecationWarning, stacklevel=2)
        split = FORMER_SPLITS[split]
    if split not in SPLITS:
        raise AttnlabError(f"split: expected one of {list(SPLITS)}, got {split!r}")
    if pos not in POSITIONS:
        raise AttnlabError(f"pos: expected one of {list(POSITIONS)}, got {pos!r}")
    if norm not in (None, "pre", "post"):
        raise AttnlabError(f"norm: expected None, 'pre' or 'post', got {norm!r}")
    residual = check_flag(residual, "residual") or norm is not None
    if tokens is not None:
        tokens = _check_tokens(tokens)
    if X is None:
        x_arr = SEED_000_X if tokens is None else token_embeddings(tokens, d_model)
    else:
        x_arr = as_float_array(X, "X")
    if x_arr.ndim != 2:
        raise ShapeError(f"X: expected (T, E), got {shape_str(x_arr.shape)}")
    T, E = x_arr.shape
    if T == 0 or E == 0:
        raise ShapeError(msg("explain.x_empty", shape=x_arr.shape))
    default_tokens = tokens is None
    if tokens is None:
        tokens = [f"word{i + 1}" for i in range(T)]
    elif len(tokens) != T:
        raise AttnlabError(f"tokens: expected {T} labels to match X's rows, got {len(tokens)}")
    tokens = [str(t) for t in tokens]
    D = _head_dim(d_k, split, E, H)
    if pos == "rope" and D % 2:
        raise ShapeError(msg("explain.rope_d_k", got=D))
    padding = check_key_padding(key_padding, (), T)
    if padding is not None and padding.shape[-1] != T:
        raise ShapeError(f"key_padding: expected (T,) = ({T},), got {shape_str(padding.shape)}")
    scale_value = check_scale(scale, D)

    rng = as_rng(seed)
    drawn = []
    weights = {}
    for name, given in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv)):
        if given is None:
            weights[name] = init_weight(E, H * D, scheme, rng=rng)
            drawn.append(name)
        else:
            w = as_float_array(given, name)
            if w.shape != (E, H * D):
                raise ShapeError(
                    f"{name}: expected (E, H*d_k) = ({E}, {H * D}) for E = {E}, H = {H}, "
                    f"d_k = {D}, got {shape_str(w.shape)}"
                )
            weights[name] = w
    wo = _output_weights(Wo, H * D, E, scheme, rng)
    if wo is None and residual and H * D != E:
        raise ShapeError(f"Wo: the residual x + attention(x) needs the attention output in X's "
                         f"width E = {E}, got H·d_k = {H}·{D} = {H * D} and no Wo; pass Wo "
                         f"(or Wo=True) or choose H·d_k = E")
    if wo is not None and residual and wo.shape[1] != E:
        raise ShapeError(f"Wo: the residual needs (H*d_k, E) = ({H * D}, {E}), "
                         f"got {shape_str(wo.shape)}")
    if Wo is True:
        drawn.append("Wo")

    steps = [Step("X", x_arr, "X")]
    x_in = x_arr
    if pos in ("sinusoidal", "learned"):
        if pos == "sinusoidal":
            table = sinusoidal_encoding(T, E)  # (T, E)
            formula = "pe[p, 2i] = sin(p / 10000^(2i/E)),  pe[p, 2i+1] = cos(p / 10000^(2i/E))"
        else:
            table = LearnedPositionalEmbedding(T, E, seed=rng).table  # (T, E)
            formula = "pe ~ N(0, 0.02²), (T, E)"
            drawn.append("pe")
        x_in = x_arr + table  # (T, E)
        steps += [Step("pe", table, formula), Step("embedded", x_in, "x = X + pe")]
    attn_in = x_in
    if norm == "pre":
        attn_in = LayerNorm(E).forward(x_in)  # (T, E)
        steps.append(Step("normed_in", attn_in, "LayerNorm(x) = (x - mean) / √(var + ε)"))

    for n, w in weights.items():  # Wv's width is d_v, which need not equal d_k
        width, per_head = ("d_v" if n == "Wv" else "d_k"), w.shape[1] // H
        size = (f"E × {width} = {E} × {per_head}" if H == 1
                else f"E × H·{width} = {E} × {H}·{per_head}")
        steps.append(Step(n, w, f"{n}: {size}"))
    source_name = {"none": "X", "sinusoidal": "x", "learned": "x", "rope": "X"}[pos]
    if norm == "pre":
        source_name = "LayerNorm(x)"
    allowed = _allowed(mask, padding, is_causal, T)
    # The real block computes everything from here to the heads' outputs; the trace reads
    # it at the block's hook points (a trace is a cache with formulas).
    check_score_elements((H, T, T), PLAIN_PATH_HINT, limit=MAX_SCORE_ELEMENTS)
    block = MultiHeadAttention(
        Wq=weights["Wq"], Wk=weights["Wk"], Wv=weights["Wv"],
        Wo=np.eye(H * D) if wo is None else wo,  # no Wo: the block's output is not read
        num_heads=H, rope=RotaryEmbedding(D) if pos == "rope" else None, scale=scale,
    )
    (projected, _), cache = run_with_cache(block, attn_in, mask=allowed,
                                           names=_READ.__contains__)  # (T, E_out), cache
    if split == "fused":
        steps += [Step(f"{n}_all", merge_heads(cache[f"hook_{n.lower()}"]),  # (T, H*D)
                       f"{n}_all = {source_name}·W{n.lower()}    (T, H·d_k)") for n in "QKV"]

    head_outputs = []
    notes: list[dict[str, Any]] = []
    for h in range(H):
        tag = {"head": h if H > 1 else None}
        if split == "fused":
            part = f"[{h}]" if H > 1 else "[0]"
            formulas = [f"{n} = {n}_all.view(T, H, d_k).transpose(0, 1){part}" for n in "QKV"]
        else:
            part = "" if H == 1 else f"[:, {h * D}:{(h + 1) * D}]"  # this head's columns
            formulas = [f"{n} = {source_name}·W{n.lower()}{part}" for n in "QKV"]
        Q, K, V = (cache[f"hook_{n}"][h] for n in "qkv")  # (T, D) each
        steps += [Step(n, m, f, **tag) for n, m, f in zip("QKV", (Q, K, V), formulas,
                                                           strict=True)]
        if pos == "rope":  # pair i of row p turned by p·θ_i
            Q, K = cache["hook_rot_q"][h], cache["hook_rot_k"][h]  # (T, D)
            steps += [Step("Q_rope", Q, "Q_rope[p] = R(p·θ)·Q[p]", **tag),
                      Step("K_rope", K, "K_rope[p] = R(p·θ)·K[p]", **tag)]
        # What the softmax read, as the block computed it; the steps before it are its
        # formula written out on the cached Q and K.
        read = cache["hook_attn_scores"][h]  # (T, T)
        last = "masked" if allowed is not None else "scaled" if scale_value != 1.0 else "scores"
        scores = read if last == "scores" else Q @ K.T  # (T, T)
        steps.append(Step("scores", scores, "scores = Q·Kᵀ", **tag))
        source = "scores"
        scaled = scores
        if scale_value != 1.0:
            scaled = read if last == "scaled" else scores * scale_value  # (T, T)
            formula = (f"scaled = scores / √d_k = scores / √{D}" if scale is None
                       else f"scaled = scores × {scale_value:g}")
            steps.append(Step("scaled", scaled, formula, **tag))
            source = "scaled"
        if last == "masked":
            steps.append(Step("masked", read, f"masked = where(allowed, {source}, -∞)", **tag))
            source = "masked"
        probs, out = cache["hook_pattern"][h], cache["hook_z"][h]  # (T, T), (T, D)
        steps += [
            Step("weights", probs, f"weights = softmax({source}, axis=-1)", **tag),
            Step("output", out, "output = weights·V", **tag),
        ]
        notes += head_notes(scaled, probs, allowed, h if H > 1 else None)
        head_outputs.append(out)

    result = head_outputs[0]
    if H > 1:
        result = np.concatenate(head_outputs, axis=-1)  # (T, H*D)
        if split == "fused":
            formula = "concat = output.transpose(0, 1).contiguous().view(T, H·d_k)"
        else:
            parts = [f"head_{h + 1}" for h in range(H)] if H <= 4 else [
                "head_1", "…", f"head_{H}"]
            formula = "concat = [" + " | ".join(parts) + "]"
        steps.append(Step("concat", result, formula))
    if wo is not None:
        result = projected  # (T, E_out): concat·Wo, the block's output
        what = "concat" if H > 1 else "output"
        Dv = wo.shape[0] // H
        steps += [Step("Wo", wo, f"Wo: H·d_v × E_out = {H}·{Dv} × {wo.shape[1]}"),
                  Step("projected", result, f"projected = {what}·Wo")]
    if residual:
        result = x_in + result  # (T, E)
        steps.append(Step("residual", result, "residual = x + attention(LayerNorm(x))"
                          if norm == "pre" else "residual = x + attention(x)"))
        if norm == "post":
            result = LayerNorm(E).forward(result)  # (T, E)
            steps.append(Step("normed", result,
                              "normed = LayerNorm(residual) = (r - mean) / √(var + ε)"))

    notes = layer_notes(attn_in, allowed, pos, tokens, scale, drawn, X is None) + notes
    if norm == "pre":  # LayerNorm maps a row with all features equal to 0: say so
        flat = np.flatnonzero(np.ptp(x_in, axis=-1) == 0)
        if flat.size:
            notes.append({"kind": "constant_rows", "head": None, "rows": flat.tolist(),
                          "tokens": [tokens[i] for i in flat]})
    meta = {"T": T, "E": E, "d_k": D, "num_heads": H, "scale": scale_value,
            "is_causal": is_causal, "masked": mask is not None,
            "key_padding": None if padding is None else padding.tolist(), "pos": pos,
            "residual": residual, "norm": norm, "split": split, "seed": seed, "scheme": scheme,
            "default_tokens": default_tokens, "notes": notes}
    return Trace(steps=steps, tokens=tokens, meta=meta)


def _head_dim(d_k: int | None, split: str, E: int, H: int) -> int:
    """d_k: given, or 3 (seed 000's) / E // H (seed 001's d_model / h, which must divide)."""
    if split == "fused":
        if E % H:
            raise ShapeError(msg("explain.fused_heads", E=E, H=H, remainder=E % H))
        if d_k is not None and check_positive_int(d_k, "d_k") * H != E:
            raise ShapeError(msg("explain.fused_d_k", d_k=E // H, got=d_k))
        return E // H
    return 3 if d_k is None else check_positive_int(d_k, "d_k")


def _output_weights(Wo: Any, width: int, E: int, scheme: str, rng: np.random.Generator,
                    ) -> np.ndarray | None:
    """Wo as given, drawn (True) as (H*d_k, E), or None."""
    if Wo is None or Wo is False:
        return None
    if Wo is True:
        return init_weight(width, E, scheme, rng=rng)
    wo = as_float_array(Wo, "Wo")
    if wo.ndim != 2 or wo.shape[0] != width or 0 in wo.shape:
        raise ShapeError(f"Wo: expected (H*d_k, E_out) = ({width}, E_out), "
                         f"got {shape_str(wo.shape)}")
    return wo


def _allowed(mask: Any, padding: np.ndarray | None, is_causal: Any, T: int) -> np.ndarray | None:
    """One (T, T) bool matrix from the mask, the key padding and causality (or None)."""
    allowed, _, _ = check_mask_and_bias(mask, None, is_causal, (T, T), np.float64)
    if padding is not None:
        keys = np.broadcast_to(padding, (T, T))  # (T, S): column j is key j
        allowed = keys.copy() if allowed is None else np.broadcast_to(allowed, (T, T)) & keys
    return None if allowed is None else np.broadcast_to(allowed, (T, T)).copy()
