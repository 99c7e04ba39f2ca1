"""The exercises: for each, attnlab's own answer, the inputs tried, and the usual mistakes.

An exercise is the seed's few lines as a function the learner writes. The checker
runs it on every :class:`Case` (random inputs first, edge cases after) and compares
with ``reference`` (attnlab's implementation). When they differ, each
:class:`Mistake` is a wrong version written the way learners write it: if the
learner's output equals a mistake's (or fails the same way), the mistake's hint
names what went wrong.

The exercises are written by section (:mod:`~attnlab.exercises.pooling`: attention
itself, :mod:`~attnlab.exercises.heads`: masks and heads,
:mod:`~attnlab.exercises.layer`: around attention) on the types of
:mod:`~attnlab.exercises.exercise`; :data:`EXERCISES` puts them in the lessons' order.

Shapes use the package legend: B batch, H heads, T query length, S key length,
D head dim (d_k), Dv value dim, E model width.
"""

from __future__ import annotations

from .exercise import Case, Exercise, Mistake
from .heads import (
    CAUSAL_MASK,
    MASKED_ATTENTION,
    MERGE_HEADS,
    MULTI_HEAD_ATTENTION,
    PADDING_MASK,
    SPLIT_HEADS,
)
from .layer import LAYER_NORM, ONLINE_ATTENTION, RESIDUAL_BLOCK, SINUSOIDAL, SOFTMAX_BACKWARD
from .pooling import (
    ATTENTION,
    ATTENTION_WITH_SINK,
    QKV,
    SCALED_SCORES,
    SCORES,
    SELF_ATTENTION,
    SOFTMAX,
)

__all__ = ["Case", "Mistake", "Exercise", "EXERCISES"]


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in (
    QKV, SCORES, SCALED_SCORES, SOFTMAX, ATTENTION, SELF_ATTENTION, CAUSAL_MASK, PADDING_MASK,
    MASKED_ATTENTION, SPLIT_HEADS, MERGE_HEADS, MULTI_HEAD_ATTENTION, SINUSOIDAL, LAYER_NORM,
    RESIDUAL_BLOCK, ONLINE_ATTENTION, SOFTMAX_BACKWARD, ATTENTION_WITH_SINK,
)}
