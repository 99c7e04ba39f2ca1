"""A trace: the named intermediate matrices of an attention computation, as data.

A :class:`Trace` is a list of :class:`Step` objects (X, Wq, Q, scores, weights,
...), each carrying its formula, shape and values, optionally tagged with the
head and layer it belongs to. It exports to a dict and JSON; rendering it (text in
English or Chinese, Markdown, heatmaps, the viewer) is :mod:`attnlab.report`'s job.

:class:`Recorder` is the hook point a forward pass hands its intermediates to.
``attnlab.lens.explain`` produces a trace; a real model's run produces the same kind.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .checks import shape_str
from .errors import AttnlabError, ShapeError

__all__ = ["Step", "Trace", "Recorder"]


@dataclass
class Step:
    """One named intermediate: ``values`` with its ``formula``; head/layer may be None."""

    key: str
    values: np.ndarray
    formula: str
    head: int | None = None
    layer: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "formula": self.formula,
            "head": self.head,
            "layer": self.layer,
            "shape": list(self.shape),
            # -inf (masked) is not valid JSON: it is written as null.
            "values": _jsonable(self.values),
        }


@dataclass
class Trace:
    """The steps of one attention computation, in order.

    ``tokens`` label the query rows (and key columns, ``key_tokens`` if they differ).
    ``meta`` holds the settings (d_k, scale, heads, causal, seed, ...).
    """

    steps: list[Step]
    tokens: list[str]
    key_tokens: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def get(self, key: str, head: int | None = None, layer: int | None = None) -> Step:
        """The step named ``key`` (of ``head``/``layer`` if given)."""
        for step in self.steps:
            if step.key == key and (head is None or step.head == head) and (
                layer is None or step.layer == layer
            ):
                return step
        keys = sorted({s.key for s in self.steps})
        raise AttnlabError(
            f"key: expected one of {keys} (head={head}, layer={layer}), got {key!r}"
        )

    @property
    def heads(self) -> list[int]:
        return sorted({s.head for s in self.steps if s.head is not None})

    def weights(self, layer: int | None = None) -> np.ndarray:
        """Attention weights of every head: (H, T, S) (one head: (1, T, S))."""
        found = [s.values for s in self.steps if s.key == "weights" and (
            layer is None or s.layer == layer)]
        if not found:
            raise AttnlabError("trace: it holds no attention weights step")
        return np.stack(found)  # (H, T, S)

    def attention(self) -> np.ndarray:
        """Weights of every recorded layer and head as one (L, H, T, S) array.

        Steps without a layer tag form a single layer (an ``explain`` trace gives
        L = 1); a trace of one head gives H = 1. Every layer must hold the same heads.
        """
        found = [s for s in self.steps if s.key == "weights"]
        if not found:
            raise AttnlabError("trace: expected a trace holding 'weights' steps, found none")
        layer_ids = sorted({s.layer for s in found if s.layer is not None})
        groups = [found] if not layer_ids else [[s for s in found if s.layer == i]
                                                for i in layer_ids]
        try:
            stacked = np.stack([np.stack([s.values for s in group]) for group in groups])
        except ValueError as exc:
            raise ShapeError(
                f"trace: its weights steps differ in shape or count ({exc})"
            ) from None
        if stacked.ndim != 4:
            raise ShapeError(
                "trace: expected (T, S) weights per head, giving (L, H, T, S), got "
                f"{shape_str(stacked.shape)}"
            )
        return stacked  # (L, H, T, S)

    @property
    def output(self) -> np.ndarray:
        """The final output of the computation (the last output-like step)."""
        for step in reversed(self.steps):
            if step.key in ("normed", "residual", "projected", "concat") or (
                    step.key == "output" and step.head is None):
                return step.values
        return self.get("output").values

    # ---- export -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "key_tokens": self.key_tokens or self.tokens,
            "meta": _jsonable(self.meta),
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent)


class Recorder:
    """Collects named intermediates during a forward pass, keeping only what is asked.

    Pass one as ``recorder=`` to :class:`attnlab.MultiHeadAttention` (or a layer,
    or a model's run): it keeps the steps in ``keep`` for the ``layers`` and
    ``heads`` chosen (None = all) and for one item of the batch, so a long input
    need not hold every tensor. The model sets ``recorder.layer`` as it goes.

    Keys: "X" (layer input), "Q", "K", "V", "scores", "scaled", "weights",
    "output" (per-head outputs), "projected" (after Wo); or keep="all".
    """

    KEYS = ("X", "Q", "K", "V", "scores", "scaled", "weights", "output", "projected")

    def __init__(
        self,
        keep: str | tuple[str, ...] | list[str] = ("weights",),
        *,
        layers: list[int] | None = None,
        heads: list[int] | None = None,
        batch_index: int = 0,
    ):
        chosen = self.KEYS if keep == "all" else tuple([keep] if isinstance(keep, str) else keep)
        unknown = [k for k in chosen if k not in self.KEYS]
        if unknown:
            raise AttnlabError(
                f"keep: expected keys from {list(self.KEYS)} or 'all', got {unknown}"
            )
        self.keep = frozenset(chosen)
        self.layers = None if layers is None else set(layers)
        self.heads = None if heads is None else sorted(set(heads))
        self.batch_index = batch_index
        self.layer: int | None = None
        self.steps: list[Step] = []

    def wants(self, key: str) -> bool:
        return key in self.keep and (self.layers is None or self.layer in self.layers)

    def add(self, key: str, values: np.ndarray, formula: str) -> None:
        """Record a whole-layer tensor (B, T, X) (or (T, X) unbatched)."""
        if self.wants(key):
            item = values[self.batch_index] if values.ndim == 3 else values  # (T, X)
            self.steps.append(Step(key, np.array(item), formula, layer=self.layer))

    def add_heads(self, key: str, values: np.ndarray, formula: str) -> None:
        """Record a per-head tensor (B, H, T, X) (or (H, T, X) unbatched), head by head."""
        if not self.wants(key):
            return
        item = values[self.batch_index] if values.ndim == 4 else values  # (H, T, X)
        for h in range(item.shape[0]) if self.heads is None else self.heads:
            if h < item.shape[0]:
                self.steps.append(
                    Step(key, np.array(item[h]), formula, head=h, layer=self.layer)
                )


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if np.issubdtype(value.dtype, np.floating):
            obj = value.astype(object)
            obj[~np.isfinite(value)] = None
            return [_jsonable(v) for v in obj] if value.ndim else obj.item()
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (np.floating, float)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
