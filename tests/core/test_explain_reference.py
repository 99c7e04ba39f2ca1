"""``explain`` against a float64 computation written here by hand, step by step, over many
option combinations.

explain reads its numbers off the real block (MultiHeadAttention under
``run_with_cache``); this reference shares no code with it: projections by column slices,
RoPE by ``rotate_half``, the softmax and LayerNorm written out. Only the inputs are taken
from the trace (X, the weights and the positional table, which explain draws).

Tolerance 1e-12, absolute and relative: both sides compute the same float64 sums of at
most E = 6 products of O(1) values, possibly in another order (batched matmuls against one
matmul per head), which leaves differences of a few ulps (~1e-15); 1e-12 is far above that
and far below any real error (a wrong scale, mask, head slice or rotation moves entries by
more than 1e-3 here). Masked entries must be -inf on both sides.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from attnlab import explain

TOL = {"rtol": 1e-12, "atol": 1e-12}
T = 4
MASK = np.tril(np.ones((T, T), dtype=bool)) | np.eye(T, k=2, dtype=bool)
PADDING = np.array([True, True, False, True])
PER_HEAD = {"Q", "K", "V", "Q_rope", "K_rope", "scores", "scaled", "masked", "weights",
            "output"}


def rope(x: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Rotate pairs (i, i + D/2) of row p by p·θ_i, θ_i = base^(-2i/D): (T, D) -> (T, D)."""
    half = x.shape[-1] // 2
    theta = base ** (-np.arange(half) * 2.0 / x.shape[-1])  # (D/2,)
    angles = np.arange(x.shape[0])[:, None] * theta  # (T, D/2)
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = x[:, :half], x[:, half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def layer_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row softmax; a row with nothing allowed (all -inf) gives zeros."""
    top = np.max(scores, axis=-1, keepdims=True)
    top = np.where(np.isneginf(top), 0.0, top)
    e = np.exp(scores - top)
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0.0, 1.0, total)


def sinusoidal(E: int) -> np.ndarray:
    """pe[p, 2i] = sin(p / 10000^(2i/E)), pe[p, 2i+1] = cos(p / 10000^(2i/E)): (T, E)."""
    pe = np.zeros((T, E))
    for p in range(T):
        for i in range(0, E, 2):
            pe[p, i] = np.sin(p / 10000 ** (i / E))
            pe[p, i + 1] = np.cos(p / 10000 ** (i / E))
    return pe


def reference(trace, *, H, D, split, pos, scale, allowed, wo, residual, norm):
    """Every step explain shows, by hand: key -> value, or (key, head) -> value."""
    expected = {}
    x = trace.get("X").values
    if pos in ("sinusoidal", "learned"):
        pe = sinusoidal(x.shape[1]) if pos == "sinusoidal" else trace.get("pe").values
        x = x + pe  # (T, E)
        expected.update({"pe": pe, "embedded": x})
    attn_in = layer_norm(x) if norm == "pre" else x
    Wq, Wk, Wv = (trace.get(n).values for n in ("Wq", "Wk", "Wv"))
    if split == "fused":
        expected.update({"Q_all": attn_in @ Wq, "K_all": attn_in @ Wk, "V_all": attn_in @ Wv})
    factor = 1 / np.sqrt(D) if scale is None else scale
    outputs = []
    for h in range(H):
        cols = slice(h * D, (h + 1) * D)
        q, k, v = attn_in @ Wq[:, cols], attn_in @ Wk[:, cols], attn_in @ Wv[:, cols]  # (T, D)
        expected.update({("Q", h): q, ("K", h): k, ("V", h): v})
        if pos == "rope":
            q, k = rope(q), rope(k)
            expected.update({("Q_rope", h): q, ("K_rope", h): k})
        scores = q @ k.T  # (T, T)
        scaled = scores * factor
        masked = scaled if allowed is None else np.where(allowed, scaled, -np.inf)
        weights = softmax(masked)
        expected.update({("scores", h): scores, ("scaled", h): scaled, ("masked", h): masked,
                         ("weights", h): weights, ("output", h): weights @ v})
        outputs.append(weights @ v)
    result = np.concatenate(outputs, axis=-1)  # (T, H*D)
    expected["concat"] = result
    if wo is not None:
        result = result @ wo
        expected["projected"] = result
    if residual:
        result = x + result
        expected["residual"] = result
        if norm == "post":
            expected["normed"] = layer_norm(result)
    if norm == "pre":
        expected["normed_in"] = attn_in
    return expected


def cases():
    """Every 7th of the 8640 combinations (7 is prime to every option's count, so each
    pair of options still meets), less those explain refuses."""
    rng = np.random.default_rng(0)
    every = itertools.product(
        (1, 2, 3), ("per_head", "fused"), ("none", "sinusoidal", "learned", "rope"),
        (None, 1.0, 0.3), ("none", "mask", "padding", "causal", "all"),
        ("none", "drawn", "given"), (None, "residual", "pre", "post"), (None, "given"),
    )
    for H, split, pos, scale, masking, wo, norm, d_k in itertools.islice(every, 0, None, 7):
        E = 6 if split == "fused" else 4
        D = E // H if split == "fused" else (2 if d_k else 3)
        if pos == "rope" and D % 2:
            continue
        if wo == "none" and norm is not None and H * D != E:
            continue  # the residual needs the attention output in X's width
        kw = {"num_heads": H, "split": split, "pos": pos, "scale": scale, "seed": 3,
              "residual": norm == "residual", "norm": None if norm == "residual" else norm,
              "d_k": (D if d_k else None)}
        if masking in ("mask", "all"):
            kw["mask"] = MASK
        if masking in ("padding", "all"):
            kw["key_padding"] = PADDING
        if masking in ("causal", "all"):
            kw["is_causal"] = True
        if wo == "drawn":
            kw["Wo"] = True
        elif wo == "given":
            kw["Wo"] = rng.standard_normal((H * D, E))
        yield kw, E, D


def allowed_of(kw):
    allowed = np.ones((T, T), dtype=bool)
    if "mask" in kw:
        allowed &= kw["mask"]
    if "key_padding" in kw:
        allowed &= kw["key_padding"][None, :]
    if kw.get("is_causal"):
        allowed &= np.tril(np.ones((T, T), dtype=bool))
    masked = any(k in kw for k in ("mask", "key_padding")) or kw.get("is_causal")
    return allowed if masked else None


@pytest.mark.parametrize("split", ["per_head", "fused"])
@pytest.mark.parametrize("pos", ["none", "sinusoidal", "learned", "rope"])
def test_every_step_equals_the_hand_computation(split, pos):
    checked = 0
    for kw, E, D in cases():
        if kw["split"] != split or kw["pos"] != pos:
            continue
        X = (np.arange(T * E, dtype=np.float64).reshape(T, E) % 5 - 2.0) * 0.7
        trace = explain(X, **kw)
        H, allowed = kw["num_heads"], allowed_of(kw)
        wo = trace.get("Wo").values if "Wo" in kw else None
        expected = reference(trace, H=H, D=D, split=split, pos=pos, scale=kw["scale"],
                             allowed=allowed, wo=wo,
                             residual=kw["residual"] or kw["norm"] is not None, norm=kw["norm"])
        for step in trace:
            key = step.key if step.head is None else (step.key, step.head)
            if step.key in PER_HEAD and H == 1:
                key = (step.key, 0)
            if key not in expected:
                continue
            want = expected.pop(key)
            blocked = np.isneginf(want)
            assert np.array_equal(np.isneginf(step.values), blocked), (kw, key)
            got, want = np.where(blocked, 0.0, step.values), np.where(blocked, 0.0, want)
            if not np.allclose(got, want, **TOL):  # assert_allclose only to say how far
                np.testing.assert_allclose(got, want, **TOL, err_msg=f"{key} for {kw}")
        # Every hand step is in the trace, but those explain leaves out by design: the
        # concat of one head, scaled with no scaling, masked without a mask.
        left = {k if isinstance(k, str) else k[0] for k in expected}
        allowed_left = {"concat"} if H == 1 else set()
        if kw["scale"] == 1.0:
            allowed_left.add("scaled")
        if allowed is None:
            allowed_left.add("masked")
        assert left <= allowed_left, (kw, left)
        np.testing.assert_array_equal(trace.output, list(trace)[-1].values)
        checked += 1
    assert checked >= 20  # the combinations above, not a filter that left none


def test_former_split_names_give_the_same_trace():
    for former, split in (("seed000", "per_head"), ("seed001", "fused")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            old = explain(num_heads=2, split=former, Wo=True, is_causal=True)
        new = explain(num_heads=2, split=split, Wo=True, is_causal=True)
        for a, b in zip(old, new, strict=True):
            np.testing.assert_array_equal(a.values, b.values)
