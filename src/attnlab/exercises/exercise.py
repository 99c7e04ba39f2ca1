# ruff: noqa: E501  (a task reads best on one line)
"""What an exercise is (:class:`Exercise`, its :class:`Case` inputs and :class:`Mistake`
versions), and the input makers and wrong softmax every section of the catalog shares.

Shapes use the package legend: B batch, H heads, T query length, S key length,
D head dim (d_k), Dv value dim, E model width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..attention import softmax

__all__ = ["Case", "Exercise", "Mistake", "attention_weights", "naive_softmax", "normal",
           "seeded_rng"]


@dataclass(frozen=True)
class Case:
    """One set of inputs: ``label`` names it for the learner (a key of hints.CASES)."""

    label: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Mistake:
    """A wrong version (``fn`` takes the exercise's arguments) and the hint that names it."""

    hint: str
    fn: Callable[..., Any]


@dataclass(frozen=True)
class Exercise:
    name: str
    signature: str
    task: tuple[str, str]  # (zh, en)
    reference: Callable[..., Any]
    cases: Callable[[], list[Case]]
    mistakes: list[Mistake] = field(default_factory=list)
    outputs: int = 1  # how many arrays the function returns
    bool_output: bool = False  # a mask: the answer must be dtype bool


def seeded_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape)


def naive_softmax(x: np.ndarray) -> np.ndarray:  # seed 000's line, no max subtracted
    return np.exp(x) / np.sum(np.exp(x), axis=-1, keepdims=True)


def attention_weights(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    return softmax(Q @ K.T / np.sqrt(K.shape[-1]), axis=-1)  # (T, S)

