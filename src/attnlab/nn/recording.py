"""Recording a multi-head attention's steps (:class:`attnlab.trace.Recorder`) is reading
its hook points: the hooks here hand Q, K, V, the weights and each head's output to the
recorder as the heads read them, and add the didactic steps a block has no point for
(the unscaled scores Q·Kᵀ and the scaled ones), computed from those values.

Dimension legend: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..hooks import HookFn
from ..trace import Recorder

__all__ = ["recording_hooks"]


def recording_hooks(mha: Any, recorder: Recorder) -> list[tuple[str, HookFn]]:
    """Hooks that hand ``mha``'s (a :class:`~attnlab.nn.MultiHeadAttention`) intermediates
    to ``recorder``, in its order: Q and K after RoPE, K and V repeated for GQA, as the
    heads read them."""
    seen: dict[str, np.ndarray] = {}
    rotated = mha.rope is not None

    def keep(value: np.ndarray, name: str) -> None:
        seen[name] = value

    def emit(weights: np.ndarray, name: str) -> None:
        q = seen["hook_rot_q" if rotated else "hook_q"]
        k = mha.expand_kv(seen["hook_rot_k" if rotated else "hook_k"])  # (B, H, S, D)
        recorder.add_heads("Q", q, "Q = X·Wq + bq")
        recorder.add_heads("K", k, "K = X·Wk + bk")
        recorder.add_heads("V", mha.expand_kv(seen["hook_v"]), "V = X·Wv + bv")
        if recorder.wants("scores") or recorder.wants("scaled"):
            scores = q @ np.swapaxes(k, -1, -2)  # (B, H, T, S)
            recorder.add_heads("scores", scores, "scores = Q·Kᵀ")
            if mha.scale is None:
                recorder.add_heads("scaled", scores / np.sqrt(mha.head_dim),
                                   f"scaled = scores / √{mha.head_dim}")
            else:
                recorder.add_heads("scaled", scores * mha.scale,
                                   f"scaled = scores × {mha.scale:g}")
        recorder.add_heads("weights", weights, "weights = softmax(scaled + mask, axis=-1)")

    def output(heads: np.ndarray, name: str) -> None:
        recorder.add_heads("output", heads, "output = weights·V")

    kept = ["hook_q", "hook_k", "hook_v"] + (["hook_rot_q", "hook_rot_k"] if rotated else [])
    return [*((n, keep) for n in kept), ("hook_pattern", emit), ("hook_z", output)]
