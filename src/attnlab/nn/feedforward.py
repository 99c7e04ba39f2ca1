"""The position-wise feed-forward sublayer and its activations (ReLU, GELU exact or tanh).

Dimension legend: E model width, F feed-forward width; ``...`` any leading dims.

    FFN(x) = act(x W1 + b1) W2 + b2        W1 (E, F), W2 (F, E)
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from ..checks import as_float_array, as_vector, check_positive_int, shape_str
from ..errors import AttnlabError, ShapeError
from ..hooks import HookSite
from ..init import as_rng, init_weight
from ..special import gelu_erf
from .heads import linear

__all__ = ["FeedForward", "gelu"]


def gelu(x: np.ndarray, approximate: Literal["none", "tanh"] = "none") -> np.ndarray:
    """GELU(x) = x · Φ(x). ``approximate="none"`` uses the exact erf (BERT), "tanh" GPT-2's."""
    x = as_float_array(x, "x", allow_nonfinite=True)  # integers -> float64, never truncated
    if approximate not in ("none", "tanh"):
        raise AttnlabError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return gelu_erf(x)  # x/2 · (1 + erf(x/√2)), float32 in cache-sized chunks


_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": gelu,
    "gelu_tanh": lambda x: gelu(x, "tanh"),
}


class FeedForward:
    """Position-wise feed-forward: act(x W1 + b1) W2 + b2.

    Shapes: x (..., E) -> (..., E); W1 (E, F), W2 (F, E).
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        scheme: str = "xavier",
        seed: int | np.random.Generator | None = 0,
    ):
        E = check_positive_int(d_model, "d_model")
        F = check_positive_int(d_ff, "d_ff")
        if activation not in _ACTIVATIONS:
            raise AttnlabError(
                f"activation: expected one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        rng = as_rng(seed)
        self.activation = activation
        self.W1, self.b1 = init_weight(E, F, scheme, rng=rng), np.zeros(F)
        self.W2, self.b2 = init_weight(F, E, scheme, rng=rng), np.zeros(E)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_pre`` (..., F) = x W1 + b1, ``hook_post`` (..., F) = act(hook_pre)."""
        return ["hook_pre", "hook_post"]

    @classmethod
    def from_weights(
        cls, W1: Any, b1: Any, W2: Any, b2: Any, *, activation: str = "relu"
    ) -> FeedForward:
        """Wrap given weights: W1 (E, F), b1 (F,), W2 (F, E), b2 (E,)."""
        w1, w2 = as_float_array(W1, "W1"), as_float_array(W2, "W2")
        if w1.ndim != 2:
            raise ShapeError(f"W1: expected (E, F), got {shape_str(w1.shape)}")
        E, F = w1.shape
        if w2.shape != (F, E):
            raise ShapeError(f"W2: expected (F, E) = ({F}, {E}), got {shape_str(w2.shape)}")
        ffn = cls(E, F, activation=activation)
        ffn.W1, ffn.b1 = w1, as_vector(b1, "b1", F)
        ffn.W2, ffn.b2 = w2, as_vector(b2, "b2", E)
        return ffn

    def __call__(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        if x.ndim < 1 or x.shape[-1] != self.W1.shape[0]:
            raise ShapeError(f"x: expected (..., {self.W1.shape[0]}), got {shape_str(x.shape)}")
        return self.forward(x)

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The feed-forward of a checked x (..., E) -> (..., E); no checks."""
        site = self.hook_site
        if site is None:
            hidden = _ACTIVATIONS[self.activation](linear(x, self.W1, self.b1))  # (..., F)
            return linear(hidden, self.W2, self.b2)  # (..., E)
        pre = site("hook_pre", linear(x, self.W1, self.b1))  # (..., F)
        hidden = site("hook_post", _ACTIVATIONS[self.activation](pre))  # (..., F)
        return linear(hidden, self.W2, self.b2)  # (..., E)
