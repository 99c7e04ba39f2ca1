"""Head ablation: run a model with some heads switched off.

    with lens.ablate(model, heads=[(3, 5), (4, 0)]):              # zero-ablation
        emb = model.encode(texts)
    with lens.ablate(model, heads=[(3, 5)], how="mean", reference=texts):
        emb = model.encode(texts)

A head's output is its slice of the concatenation that the output projection reads,
``weights·V`` (B, T, Dv) before ``Wo``. ``how="zero"`` replaces it with zeros, which
is exactly the model with that head's rows ``Wo[h·Dv:(h+1)·Dv, :]`` set to zero (the
tests check this weight surgery). ``how="mean"`` replaces it with its mean over the
real tokens of a ``reference`` set of inputs (texts or ids; or the means themselves,
an (L, H, Dv) array from :func:`head_means`): the head then adds only its average
contribution, which removes what it does for *this* input without shifting the
residual stream away from what the later layers are used to.

Layers and heads are 0-based. Inside the ``with`` block the model runs its plain
per-block path; on leaving, the model is its own again, even after an exception.

Dimension legend: L layers, H heads, T tokens, Dv value head dim.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np

from ..checks import shape_str
from ..errors import AttnlabError
from .hooks import check_model, hooked, to_numpy
from .runs import record

__all__ = ["ablate", "check_heads", "head_means"]

Ablation = Literal["zero", "mean"]


def check_heads(model: Any, heads: Any, name: str = "heads") -> list[tuple[int, int]]:
    """``heads`` as a list of (layer, head) pairs, 0-based and in range."""
    shape = check_model(model)
    L, H = shape.layers, shape.heads
    try:
        pairs = [(int(layer), int(head)) for layer, head in heads]
        exact = all(float(a) == x and float(b) == y and not isinstance(a, (bool, np.bool_))
                    and not isinstance(b, (bool, np.bool_))  # (True, False) is no pair
                    for (a, b), (x, y) in zip(heads, pairs, strict=True))
    except (TypeError, ValueError):
        raise AttnlabError(f"{name}: expected a list of (layer, head) pairs, got "
                           f"{heads!r}") from None
    bad = [p for p in pairs if not (0 <= p[0] < L and 0 <= p[1] < H)]
    if not exact or bad:
        raise AttnlabError(f"{name}: expected (layer, head) pairs with layer in 0..{L - 1} and "
                           f"head in 0..{H - 1}, got {bad[0] if bad else heads!r}")
    return pairs


def head_means(model: Any, reference: Any) -> np.ndarray:
    """Each head's output averaged over the real tokens of ``reference``: (L, H, Dv)."""
    run = record(model, reference, "reference")
    real = run.real[:, None, :, None].astype(np.float64)  # (B, 1, T, 1)
    count = real.sum()
    return np.stack([(heads * real).sum(axis=(0, 2)) / count for heads in run.heads])


@contextmanager
def ablate(
    model: Any, heads: Sequence[tuple[int, int]], *, how: Ablation = "zero",
    reference: Any = None,
) -> Iterator[Any]:
    """Run ``model`` with the (layer, head) pairs in ``heads`` ablated; yields the model.

    ``how="zero"``: their outputs become 0. ``how="mean"``: their outputs become the
    mean over ``reference`` (texts, token ids, or an (L, H, Dv) array of
    :func:`head_means`), the same vector at every position.
    """
    pairs = check_heads(model, heads)
    if how not in ("zero", "mean"):
        raise AttnlabError(f"how: expected 'zero' or 'mean', got {how!r}")
    shape = check_model(model)
    L, H, Dv = shape.layers, shape.heads, shape.value_head_dim
    means = None
    if how == "mean":
        if reference is None:
            raise AttnlabError("reference: how='mean' needs reference inputs (texts or ids) "
                               "or their head means (L, H, Dv), got None")
        if isinstance(reference, np.ndarray) and np.issubdtype(reference.dtype, np.floating):
            if reference.shape != (L, H, Dv):
                raise AttnlabError(f"reference: expected head means of shape ({L}, {H}, {Dv}) "
                                   f"(L, H, Dv), got {shape_str(reference.shape)}")
            means = reference
        elif hasattr(reference, "detach") and reference.is_floating_point():
            means = to_numpy(reference)
            if means.shape != (L, H, Dv):
                raise AttnlabError(f"reference: expected head means of shape ({L}, {H}, {Dv}) "
                                   f"(L, H, Dv), got {shape_str(means.shape)}")
        else:
            means = head_means(model, reference)
    elif reference is not None:
        raise AttnlabError("reference: only how='mean' reads a reference, got one with "
                           "how='zero'")
    by_layer: dict[int, list[int]] = {}
    for layer, head in pairs:
        by_layer.setdefault(layer, []).append(head)

    def replace(layer: int, outputs: np.ndarray) -> np.ndarray | None:
        chosen = by_layer.get(layer)
        if not chosen:
            return None
        outputs = outputs.copy()  # (B, H, T, Dv)
        for head in chosen:
            outputs[:, head] = 0.0 if means is None else means[layer, head]
        return outputs

    with hooked(model, heads=replace):
        yield model
