"""Activation patching: which heads (or which layers' residual stream) carry what
makes a clean input's result differ from a corrupted one's.

The corrupted input is run with some activations taken from the clean run, and a
``metric`` of the result says how much of the clean behaviour came back::

    lens.patch(model, clean, corrupted, heads=[(3, 5)])          # one head, every position
    lens.patch(model, clean, corrupted, layers=[2], positions=[4])  # the residual stream
    table = lens.patch_sweep(model, clean, corrupted)            # (L, H): every head alone
    lens.path_patch(model, clean, corrupted, sender=(1, 3), receivers=[(4, 0), (5, 2)])

``clean`` and ``corrupted`` are one text or one row of token ids each, with the same
number of tokens (positions are patched one to one). ``metric(hidden (1, T, E),
real (1, T)) -> float`` reads the patched run's last hidden states; the default,
:func:`embedding_cosine`, is the cosine between the patched run's sentence embedding
and the clean run's (1 = the clean result fully restored).

Patched sites: a head's output (weights·V, before Wo, as in :mod:`.ablation`), or a
block's output (the residual stream after layer l). ``positions`` (0-based token
indices; None = all) restricts the patch to those positions.

Path patching (Wang et al. 2022, TransformerLens's ``path_patch``) isolates the
effect of a *sender* head on chosen *receiver* heads in later layers:

1. run the corrupted input with the sender's output taken from the clean run (at
   ``positions``) and every other head frozen at its corrupted-run output, except
   the receivers, which are recomputed; keep the receivers' outputs;
2. run the corrupted input with only the receivers' outputs replaced by those of
   step 1 (at every position), and measure.

So the sender's clean output reaches the metric only through the receivers; what it
passes through on the way (the residual stream, LayerNorms, feed-forward layers)
is recomputed, as in TransformerLens.

Dimension legend: L layers, H heads, T tokens, Dv value head dim, E width.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..messages import msg
from .ablation import check_heads
from .hooks import check_model, forward, hooked
from .runs import Activations, record, sentence_embeddings

__all__ = ["Metric", "embedding_cosine", "patch", "patch_sweep", "path_patch", "token_cosine"]

Metric = Callable[[np.ndarray, np.ndarray], float]


def embedding_cosine(reference: Activations) -> Metric:
    """A metric: cosine of the run's sentence embedding with ``reference``'s."""
    target = sentence_embeddings(reference.hidden, reference.real)[0]  # (E,)

    def metric(hidden: np.ndarray, real: np.ndarray) -> float:
        return float(sentence_embeddings(hidden, real)[0] @ target)

    return metric


def token_cosine(reference: Activations, position: int) -> Metric:
    """A metric: cosine of the run's hidden state at ``position`` with ``reference``'s."""
    T = reference.hidden.shape[1]
    if not -T <= position < T:
        raise AttnlabError(f"position: expected a token index in 0..{T - 1}, got {position}")
    target = reference.hidden[0, position]  # (E,)

    def metric(hidden: np.ndarray, real: np.ndarray) -> float:
        state = hidden[0, position]  # (E,)
        return float(state @ target / max(np.linalg.norm(state) * np.linalg.norm(target),
                                          1e-30))

    return metric


def _runs(model: Any, clean: Any, corrupted: Any) -> tuple[Activations, Activations]:
    check_model(model)
    clean_run = record(model, clean, "clean")
    corrupted_run = record(model, corrupted, "corrupted")
    for name, run in (("clean", clean_run), ("corrupted", corrupted_run)):
        if run.ids.shape[0] != 1:
            raise AttnlabError(f"{name}: expected one text or one row of ids, got "
                               f"{run.ids.shape[0]}")
    if clean_run.ids.shape != corrupted_run.ids.shape:
        raise AttnlabError(f"corrupted: expected as many tokens as clean "
                           f"({clean_run.ids.shape[1]}), got {corrupted_run.ids.shape[1]}")
    return clean_run, corrupted_run


def _positions(positions: Any, T: int) -> np.ndarray:
    """Token indices (n,) or a boolean (T,) selecting every position when None."""
    if positions is None:
        return np.ones(T, dtype=bool)
    try:
        chosen = [int(p) for p in positions]
        # int() truncates 1.5 to 1 and reads True as 1: only whole numbers are indices
        exact = all(float(p) == i and not isinstance(p, (bool, np.bool_))
                    for p, i in zip(positions, chosen, strict=True))
    except (TypeError, ValueError):
        raise AttnlabError(f"positions: expected token indices, got {positions!r}") from None
    if not exact:
        raise AttnlabError(msg("lens.whole_positions", got=repr(positions)))
    bad = [p for p in chosen if not 0 <= p < T]
    if bad or not chosen:
        raise AttnlabError(f"positions: expected token indices in 0..{T - 1}, got "
                           f"{bad[0] if bad else positions!r}")
    mask = np.zeros(T, dtype=bool)
    mask[chosen] = True
    return mask


def _run(model: Any, run: Activations, heads: Any = None, residual: Any = None) -> np.ndarray:
    with hooked(model, heads=heads, residual=residual):
        return forward(model, run.ids, run.real)  # (1, T, E)


def patch(
    model: Any, clean: Any, corrupted: Any, *, heads: Sequence[tuple[int, int]] | None = None,
    layers: Sequence[int] | None = None, positions: Sequence[int] | None = None,
    metric: Metric | None = None,
) -> float:
    """The metric of the corrupted run with clean activations patched in.

    Exactly one of ``heads`` ((layer, head) pairs: their outputs) or ``layers``
    (their blocks' outputs, the residual stream) says what is patched;
    ``positions`` which tokens (None = all). ``metric`` defaults to
    :func:`embedding_cosine` with the clean run.
    """
    clean_run, corrupted_run = _runs(model, clean, corrupted)
    return _patch(model, clean_run, corrupted_run, heads, layers, positions, metric)


def _patch(model: Any, clean_run: Activations, corrupted_run: Activations, heads: Any,
           layers: Any, positions: Any, metric: Metric | None) -> float:
    if (heads is None) == (layers is None):
        raise AttnlabError("heads, layers: expected exactly one of them (what to patch), got "
                           f"{'both' if heads is not None else 'neither'}")
    where = _positions(positions, clean_run.ids.shape[1])  # (T,)
    measure = embedding_cosine(clean_run) if metric is None else metric
    if not callable(measure):
        raise AttnlabError(f"metric: expected a function (hidden, real) -> float, got "
                           f"{type(measure).__name__}")
    if heads is not None:
        by_layer: dict[int, list[int]] = {}
        for layer, head in check_heads(model, heads):
            by_layer.setdefault(layer, []).append(head)

        def patch_heads(layer: int, outputs: np.ndarray) -> np.ndarray | None:
            if layer not in by_layer:
                return None
            outputs = outputs.copy()  # (1, H, T, Dv)
            for head in by_layer[layer]:
                outputs[:, head, where] = clean_run.heads[layer][:, head, where]
            return outputs

        hidden = _run(model, corrupted_run, heads=patch_heads)
    else:
        L = check_model(model).layers
        chosen = _layer_list(layers, L)

        def patch_residual(layer: int, x: np.ndarray) -> np.ndarray | None:
            if layer not in chosen:
                return None
            x = x.copy()  # (1, T, E)
            x[:, where] = clean_run.residual[layer][:, where]
            return x

        hidden = _run(model, corrupted_run, residual=patch_residual)
    return float(measure(hidden, corrupted_run.real))


def _layer_list(layers: Any, L: int) -> set[int]:
    try:
        chosen = {int(layer) for layer in layers}
    except (TypeError, ValueError):
        raise AttnlabError(f"layers: expected layer indices, got {layers!r}") from None
    bad = [layer for layer in chosen if not 0 <= layer < L]
    if bad or not chosen:
        raise AttnlabError(f"layers: expected indices in 0..{L - 1}, got "
                           f"{bad[0] if bad else layers!r}")
    return chosen


def patch_sweep(
    model: Any, clean: Any, corrupted: Any, *, positions: Sequence[int] | None = None,
    metric: Metric | None = None, site: str = "heads",
) -> np.ndarray:
    """:func:`patch` of every site alone: a table of the metric.

    ``site="heads"``: every head alone (at ``positions``) -> (L, H).
    ``site="residual"``: the residual stream after every layer at every single
    position -> (L, T) (``positions`` must then be None).
    """
    clean_run, corrupted_run = _runs(model, clean, corrupted)
    shape = check_model(model)
    L, H, T = shape.layers, shape.heads, clean_run.ids.shape[1]
    if site == "heads":
        table = np.zeros((L, H))  # (L, H)
        for layer in range(L):
            for head in range(H):
                table[layer, head] = _patch(model, clean_run, corrupted_run, [(layer, head)],
                                            None, positions, metric)
        return table
    if site != "residual":
        raise AttnlabError(f"site: expected 'heads' or 'residual', got {site!r}")
    if positions is not None:
        raise AttnlabError("positions: the residual sweep patches every position in turn, "
                           "expected None")
    table = np.zeros((L, T))  # (L, T)
    for layer in range(L):
        for position in range(T):
            table[layer, position] = _patch(model, clean_run, corrupted_run, None, [layer],
                                            [position], metric)
    return table


def path_patch(
    model: Any, clean: Any, corrupted: Any, *, sender: tuple[int, int],
    receivers: Sequence[tuple[int, int]], positions: Sequence[int] | None = None,
    metric: Metric | None = None,
) -> float:
    """The metric when the sender head's clean output reaches only the receivers.

    ``sender`` (layer, head); ``receivers`` (layer, head) pairs in later layers;
    ``positions`` where the sender is patched (None = all). See the module's
    description for the two runs.
    """
    clean_run, corrupted_run = _runs(model, clean, corrupted)
    (sender_layer, sender_head), = check_heads(model, [sender], "sender")
    receiver_pairs = check_heads(model, receivers, "receivers")
    if not receiver_pairs:
        raise AttnlabError("receivers: expected at least one (layer, head), got none")
    early = [p for p in receiver_pairs if p[0] <= sender_layer]
    if early:
        raise AttnlabError(f"receivers: expected heads in layers after the sender's "
                           f"({sender_layer}), got {early[0]}")
    where = _positions(positions, clean_run.ids.shape[1])  # (T,)
    measure = embedding_cosine(clean_run) if metric is None else metric
    receiving: dict[int, list[int]] = {}
    for layer, head in receiver_pairs:
        receiving.setdefault(layer, []).append(head)
    received: dict[int, np.ndarray] = {}

    def sender_and_frozen(layer: int, outputs: np.ndarray) -> np.ndarray:
        patched = corrupted_run.heads[layer].copy()  # (1, H, T, Dv): every head frozen
        if layer == sender_layer:
            patched[:, sender_head, where] = clean_run.heads[layer][:, sender_head, where]
        for head in receiving.get(layer, []):
            patched[:, head] = outputs[:, head]  # recomputed from the patched stream
        if layer in receiving:
            received[layer] = outputs.copy()
        return patched

    _run(model, corrupted_run, heads=sender_and_frozen)

    def receivers_only(layer: int, outputs: np.ndarray) -> np.ndarray | None:
        if layer not in receiving:
            return None
        outputs = outputs.copy()  # (1, H, T, Dv)
        for head in receiving[layer]:
            outputs[:, head] = received[layer][:, head]
        return outputs

    hidden = _run(model, corrupted_run, heads=receivers_only)
    return float(measure(hidden, corrupted_run.real))
