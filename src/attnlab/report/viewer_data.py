"""The viewer's optional data for decoders, pairs and the neuron view, checked and packed.

:func:`viewer_extras` turns what :func:`attnlab.report.viewer.render_html` accepts beyond
the weights into the page's JSON fields:

- ``allowed`` (T, S) bool, True = may attend (attnlab's one mask convention): packed
  as bits; the page hatches the other cells and never writes a number in them;
- ``prompt_length``: tokens from there on were generated (the step slider and the
  labels tell them apart);
- ``heads_per_kv``: query heads sharing one key/value head (GQA); heads are grouped;
- ``segments`` (T,) of 0 / 1: sentence A / B of a pair (the A/B filters);
- ``queries`` (L, H, T, D), ``keys`` (L, Hkv, S, D), ``scales`` (L,): the neuron view
  (q, k and q·k per dimension; logit = q·k · scale);
- ``value_norms`` (L, H, S): ‖v_j W_O^h‖, so the norms view shows α_ij · ‖v_j W_O^h‖
  (Kobayashi et al. 2020);
- ``start`` (layer, head): the head the page opens on (indices into the shown L, H).

Floats travel as little-endian float32, zlib-compressed and base64-encoded, as the
weights do; the page reads them with the browser's own ``DecompressionStream``.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..checks import as_bool_mask, as_float_array, shape_str
from ..errors import AttnlabError, ShapeError

__all__ = ["NEURON_LIMIT", "pack_floats", "unpack_floats", "viewer_extras"]

#: The neuron view's q and k of every layer travel while L·(H + Hkv)·T·D is at most
#: this many numbers (16 MB of float32 before compression); beyond, the opening layer's.
NEURON_LIMIT = 4_000_000
_OUTSIDE_TOL = 1e-4  # weight where `allowed` is False: float16 weights round to < 1e-4


def pack_floats(values: np.ndarray) -> str:
    """float32, little-endian, zlib, base64 (the page's ``floats()`` reads it back)."""
    raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def unpack_floats(text: str, shape: Sequence[int]) -> np.ndarray:
    """The inverse of :func:`pack_floats` (what the page computes), as float64."""
    raw = zlib.decompress(base64.b64decode(text))
    return np.frombuffer(raw, dtype="<f4").reshape(tuple(shape)).astype(np.float64)


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not low <= value <= high:
        raise AttnlabError(f"{name}: expected an int in [{low}, {high}], got {value!r}")
    return int(value)


def _floats(value: Any, name: str, shape: tuple[int, ...], legend: str) -> np.ndarray:
    array = as_float_array(value, name)
    if array.shape != shape:
        raise ShapeError(f"{name}: expected {legend} = {shape_str(shape)}, "
                         f"got {shape_str(array.shape)}")
    return array


def viewer_extras(
    w: np.ndarray,
    *,
    allowed: Any = None,
    prompt_length: int | None = None,
    heads_per_kv: int | None = None,
    segments: Sequence[int] | None = None,
    queries: Any = None,
    keys: Any = None,
    scales: Any = None,
    value_norms: Any = None,
    start: tuple[int, int] | None = None,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """The page's JSON fields for the options above, and the (T, S) allowed mask (or None).

    ``w`` is the checked (L, H, T, S) weights. Raises naming the argument on bad input.
    """
    L, H, T, S = w.shape
    extras: dict[str, Any] = {}
    mask = None
    if allowed is not None:
        mask = as_bool_mask(allowed, "allowed")
        if mask.shape != (T, S):
            raise ShapeError(f"allowed: expected bool (T, S) = {shape_str((T, S))} "
                             f"(True = may attend), got {shape_str(mask.shape)}")
        outside = np.where(mask, 0.0, w)  # (L, H, T, S)
        if outside.max() > _OUTSIDE_TOL:
            where = tuple(int(i) for i in np.unravel_index(outside.argmax(), outside.shape))
            raise AttnlabError(f"allowed: weights put {outside.max():.3g} on a position "
                               f"allowed says may not be attended (l, h, t, s) = {where}")
        bits = np.packbits(mask.reshape(-1))  # row-major, most significant bit first
        extras["allowed"] = base64.b64encode(zlib.compress(bits.tobytes(), 9)).decode("ascii")
    if prompt_length is not None:
        if T != S:
            raise AttnlabError("prompt_length: expected self-attention (T == S), "
                               f"got T = {T}, S = {S}")
        extras["prompt_length"] = _int(prompt_length, "prompt_length", 1, T)
    if heads_per_kv is not None:
        group = _int(heads_per_kv, "heads_per_kv", 1, 1 << 16)
        extras["heads_per_kv"] = group
    if segments is not None:
        if isinstance(segments, (str, bytes)) or not hasattr(segments, "__iter__"):
            raise AttnlabError(f"segments: expected {T} sentence numbers (0 = A, 1 = B), "
                               f"got {segments!r}")
        items = list(segments)
        if T != S or len(items) != T or any(
                isinstance(s, bool) or s not in (0, 1) for s in items):
            raise AttnlabError(f"segments: expected {T} sentence numbers, each 0 (A) or 1 "
                               f"(B), for self-attention, got {items!r}"[:300])
        extras["segments"] = [int(s) for s in items]
    if (queries is None) != (keys is None) or (queries is None) != (scales is None):
        given = [name for name, value in (("queries", queries), ("keys", keys),
                                          ("scales", scales)) if value is not None]
        raise AttnlabError("queries, keys, scales: expected all three (the neuron view) or "
                           f"none, got only {', '.join(given)}")
    if queries is not None:
        q = as_float_array(queries, "queries")
        if q.ndim != 4 or q.shape[:3] != (L, H, T):
            raise ShapeError(f"queries: expected (L, H, T, D) = ({L}, {H}, {T}, D), "
                             f"got {shape_str(q.shape)}")
        D = q.shape[3]
        k = as_float_array(keys, "keys")
        if k.ndim != 4 or k.shape[0] != L or k.shape[2:] != (S, D) or k.shape[1] < 1 \
                or H % k.shape[1]:
            raise ShapeError(f"keys: expected (L, Hkv, S, D) = ({L}, Hkv, {S}, {D}) with Hkv "
                             f"dividing H = {H}, got {shape_str(k.shape)}")
        s = _floats(scales, "scales", (L,), "(L,)")
        layers = list(range(L))
        if L * (H + k.shape[1]) * max(T, S) * D > NEURON_LIMIT:
            layers = [start[0] if start is not None else 0]
        extras["neuron"] = {
            "layers": layers, "D": D, "kv_heads": int(k.shape[1]),
            "scales": [float(v) for v in s],
            "q": pack_floats(q[layers]), "k": pack_floats(k[layers]),
        }
    if value_norms is not None:
        norms = _floats(value_norms, "value_norms", (L, H, S), "(L, H, S)")
        if not (np.isfinite(norms).all() and norms.min() >= 0):
            raise AttnlabError("value_norms: expected finite norms >= 0")
        extras["value_norms"] = pack_floats(norms)
    if start is not None:
        if not isinstance(start, (tuple, list)) or len(start) != 2:
            raise AttnlabError(f"start: expected (layer, head) indices, got {start!r}")
        extras["start"] = [_int(start[0], "start[0] (layer)", 0, L - 1),
                           _int(start[1], "start[1] (head)", 0, H - 1)]
    return extras, mask
