"""The approximations the study compares with exact attention, and how each is run.

Each :class:`Method` names its knob (window W, block size b, Linformer rows k, Nyström
landmarks m, Performer features M), the :class:`~attnlab.studies.approx.StudyConfig`
field holding its values, and how to build its parameters (not timed) and the call
that is timed. Dimension legend: B batch, T query length, S key length, D head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..fast.block_sparse import block_sparse_attention
from ..fast.lowrank import linformer_attention, linformer_projection, nystrom_attention
from ..fast.performer import orthogonal_random_features, performer_attention
from ..fast.sparse import sliding_window_attention
from ..messages import render

__all__ = ["METHODS", "METHOD_LABELS", "Method"]


@dataclass(frozen=True)
class Method:
    """One approximation: its name, its knob, and how to run it (non-causal)."""

    name: str
    knob: str
    values_field: str  # the StudyConfig field with the knob's values
    kind: str  # "sparse" (exact for its pattern) or "low-rank" (an approximation)
    #: Whether a knob value is worth running at length T (e.g. k < T).
    useful: Callable[[int, int], bool]
    #: Build the per-input parameters (not timed) and return the timed call.
    prepare: Callable[[np.ndarray, np.ndarray, np.ndarray, int, int], Callable[[], np.ndarray]]


def _prepare_window(q: np.ndarray, k: np.ndarray, v: np.ndarray, value: int,
                    seed: int) -> Callable[[], np.ndarray]:
    return lambda: sliding_window_attention(q, k, v, value, is_causal=False)


def _prepare_blocks(q: np.ndarray, k: np.ndarray, v: np.ndarray, value: int,
                    seed: int) -> Callable[[], np.ndarray]:
    return lambda: block_sparse_attention(q, k, v, value, seed=seed)


def _prepare_linformer(q: np.ndarray, k: np.ndarray, v: np.ndarray, value: int,
                       seed: int) -> Callable[[], np.ndarray]:
    E = linformer_projection(k.shape[-2], value, seed=seed, dtype=q.dtype)  # (k, S)
    F = linformer_projection(k.shape[-2], value, seed=seed + 1, dtype=q.dtype)  # (k, S)
    return lambda: linformer_attention(q, k, v, E, F)


def _prepare_linformer_pool(q: np.ndarray, k: np.ndarray, v: np.ndarray, value: int,
                            seed: int) -> Callable[[], np.ndarray]:
    E = linformer_projection(k.shape[-2], value, kind="pool", dtype=q.dtype)  # (k, S)
    return lambda: linformer_attention(q, k, v, E)


def _prepare_nystrom(q: np.ndarray, k: np.ndarray, v: np.ndarray, value: int,
                     seed: int) -> Callable[[], np.ndarray]:
    return lambda: nystrom_attention(q, k, v, value)


def _prepare_performer(q: np.ndarray, k: np.ndarray, v: np.ndarray, value: int,
                       seed: int) -> Callable[[], np.ndarray]:
    omega = orthogonal_random_features(value, q.shape[-1], seed=seed).astype(q.dtype)
    return lambda: performer_attention(q, k, v, projection=omega)


METHODS = (
    Method("sliding_window", "W", "windows", "sparse", lambda w, T: w < 2 * T - 1,
           _prepare_window),
    Method("block_sparse", "b", "block_sizes", "sparse", lambda b, T: b < T, _prepare_blocks),
    Method("linformer", "k", "linformer_k", "low-rank", lambda k, T: k < T, _prepare_linformer),
    Method("linformer_pool", "k", "linformer_k", "low-rank", lambda k, T: k < T,
           _prepare_linformer_pool),
    Method("nystrom", "m", "nystrom_m", "low-rank", lambda m, T: m < T, _prepare_nystrom),
    Method("performer", "M", "performer_features", "low-rank", lambda m, T: True,
           _prepare_performer),
)

#: Method -> what it is, in English (keyed: ``approx.method.<name>`` in
#: :mod:`attnlab.messages.studies`, which holds the Chinese too).
METHOD_LABELS = {method.name: render(f"approx.method.{method.name}") for method in METHODS}
