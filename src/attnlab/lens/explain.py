"""``explain``: run self-attention step by step and keep every matrix.

The default is seed 000's worked example: three words of four dims,

    X = [[1, 0, 1, 0],   # word 1
         [0, 2, 0, 2],   # word 2
         [1, 1, 1, 1]]   # word 3

with random 4×3 projections Wq, Wk, Wv drawn from a fixed seed (standard
normal, as the seed's ``np.random.randn(4, 3)``), so every run prints the same
numbers.

The weights and outputs come from the library's one attention kernel
(:func:`attnlab.kernel.attend`, after :func:`attnlab.kernel.check_inputs`), the
same as :func:`attnlab.scaled_dot_product_attention`; the scores shown before them
are the kernel's formula written out, step by step.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ..errors import (
    AttnlabError,
    ShapeError,
    as_float_array,
    check_alloc,
    check_positive_int,
    check_text,
    shape_str,
)
from ..init import as_rng, init_weight
from ..kernel import attend, check_inputs
from ..trace import Step, Trace

__all__ = ["explain", "SEED_000_X", "token_embeddings"]

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
    d_k: int = 3,
    d_model: int = 4,
    num_heads: int = 1,
    mask: Any = None,
    is_causal: bool = False,
    seed: int = 0,
    scheme: str = "normal",
) -> Trace:
    """Self-attention on ``X`` with every intermediate recorded.

    Shapes:
        X        (T, E); default seed 000's (3, 4), or ``token_embeddings(tokens,
                 d_model)`` (T, d_model) when only ``tokens`` are given
        tokens   T labels (default "word1".. / the tokens given)
        Wq, Wk   (E, H*d_k);  Wv (E, H*d_k) — head h uses columns h*d_k:(h+1)*d_k
        Wo       (H*d_k, E_out), optional; without it the heads are just concatenated
                 (seed 000's multi_head_attention)
        mask     bool, broadcastable to (T, T); True = may attend
        is_causal  True: token i may attend to tokens j <= i only (combined with mask)
        -> Trace with steps X, Wq, Wk, Wv, then per head Q, K, V, scores, scaled,
           [masked], weights, output, then concat [, Wo, projected] for H > 1.

    Formula, for each head h (Wq_h = Wq[:, h*d_k:(h+1)*d_k], likewise Wk_h, Wv_h)::

        Q, K, V = X·Wq_h, X·Wk_h, X·Wv_h           (T, d_k) each
        scores  = Q·Kᵀ                             (T, T)
        scaled  = scores / √d_k
        masked  = scaled, with -∞ where blocked    (only with mask or is_causal)
        weights = softmax(masked or scaled, axis=-1)   each row sums to 1
        output  = weights·V                        (T, d_k)

    then, for H > 1, concat = [output_1 | … | output_H] (T, H*d_k) and, with Wo,
    projected = concat·Wo (T, E_out).

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

    Print it with :func:`attnlab.report.to_text`, save it with :func:`attnlab.report.save`.
    """
    H = check_positive_int(num_heads, "num_heads")
    D = check_positive_int(d_k, "d_k")
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
        raise ShapeError(f"X: expected at least one token and one feature, got {x_arr.shape}")
    if tokens is None:
        tokens = [f"word{i + 1}" for i in range(T)]
    elif len(tokens) != T:
        raise AttnlabError(f"tokens: expected {T} labels to match X's rows, got {len(tokens)}")
    tokens = [str(t) for t in tokens]

    rng = as_rng(seed)
    weights = {}
    for name, given in (("Wq", Wq), ("Wk", Wk), ("Wv", Wv)):
        if given is None:
            weights[name] = init_weight(E, H * D, scheme, rng=rng)
        else:
            w = as_float_array(given, name)
            if w.shape != (E, H * D):
                raise ShapeError(
                    f"{name}: expected (E, H*d_k) = ({E}, {H * D}) for E = {E}, H = {H}, "
                    f"d_k = {D}, got {shape_str(w.shape)}"
                )
            weights[name] = w

    steps = [Step("X", x_arr, "X")]
    size = f"E × d_k = {E} × {D}" if H == 1 else f"E × H·d_k = {E} × {H}·{D}"
    steps += [Step(n, w, f"{n}: {size}") for n, w in weights.items()]
    head_outputs = []
    scale = 1.0 / np.sqrt(D)
    for h in range(H):
        cols = slice(h * D, (h + 1) * D)
        tag = {"head": h if H > 1 else None}
        part = "" if H == 1 else f"[:, {h * D}:{(h + 1) * D}]"  # this head's columns
        Q = x_arr @ weights["Wq"][:, cols]  # (T, D)
        K = x_arr @ weights["Wk"][:, cols]  # (T, D)
        V = x_arr @ weights["Wv"][:, cols]  # (T, D)
        # The library's one boundary check (mask shape and dtype, causal alignment, ranges).
        inputs = check_inputs(Q, K, V, mask, is_causal=is_causal, scale=scale)
        scores = Q @ K.T  # (T, T)
        scaled = scores * inputs.scale  # (T, T)
        steps += [
            Step("Q", Q, f"Q = X·Wq{part}", **tag),
            Step("K", K, f"K = X·Wk{part}", **tag),
            Step("V", V, f"V = X·Wv{part}", **tag),
            Step("scores", scores, "scores = Q·Kᵀ", **tag),
            Step("scaled", scaled, f"scaled = scores / √d_k = scores / √{D}", **tag),
        ]
        source = "scaled"
        if inputs.allowed is not None:
            source = "masked"
            masked = np.where(inputs.allowed, scaled, -np.inf)  # (T, T)
            steps.append(Step("masked", masked, "masked = scaled where allowed, else -∞", **tag))
        out, probs = attend(inputs.q, inputs.k, inputs.v, inputs.allowed, None, inputs.scale)
        steps += [
            Step("weights", probs, f"weights = softmax({source}, axis=-1)", **tag),  # (T, T)
            Step("output", out, "output = weights·V", **tag),  # (T, D)
        ]
        head_outputs.append(out)

    if H > 1:
        concat = np.concatenate(head_outputs, axis=-1)  # (T, H*D)
        parts = [f"head_{h + 1}" for h in range(H)] if H <= 4 else ["head_1", "…", f"head_{H}"]
        steps.append(Step("concat", concat, "concat = [" + " | ".join(parts) + "]"))
        if Wo is not None:
            wo = as_float_array(Wo, "Wo")
            if wo.ndim != 2 or wo.shape[0] != H * D:
                raise ShapeError(f"Wo: expected ({H * D}, E_out), got {shape_str(wo.shape)}")
            steps += [Step("Wo", wo, f"Wo: H·d_k × E_out = {H}·{D} × {wo.shape[1]}"),
                      Step("projected", concat @ wo, "out = concat·Wo")]
    elif Wo is not None:
        raise AttnlabError("Wo: only used with num_heads > 1 (it mixes the heads)")

    meta = {"T": T, "E": E, "d_k": D, "num_heads": H, "scale": scale, "is_causal": is_causal,
            "masked": mask is not None, "seed": seed, "scheme": scheme}
    return Trace(steps=steps, tokens=tokens, meta=meta)
