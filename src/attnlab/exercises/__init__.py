"""Graded exercises: the learner writes the seeds' lines, attnlab checks them.

>>> import numpy as np
>>> from attnlab import exercises
>>> def scores(Q, K):            # (T, D), (S, D) -> (T, S)
...     return Q @ K             # forgot the transpose
>>> result = exercises.check("scores", scores, lang="en")
>>> result.passed, result.hint
(False, 'Did you transpose K? The scores are Q @ K.T, of shape (T, S).')

:func:`check` runs the function on random inputs and edge cases (large logits, a
single token, a fully masked row...) and compares it with attnlab's own
implementation. When they differ it looks for the usual mistake that gives the
learner's very output (no 1/√d_k, softmax along the wrong axis, the mask the wrong
way round, no max subtracted...) and names it in the learner's language. A
function that raises is reported, never re-raised: a lesson's check cell always runs.
"""

from __future__ import annotations

import copy
import html
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..messages import Message
from .catalog import EXERCISES, Case, Exercise
from .hints import LANGS, hint

__all__ = ["Result", "check", "names", "task"]


@dataclass(frozen=True)
class Result:
    """The verdict on one solution.

    ``passed``: every case matched attnlab. ``hint``: what to do next, in ``lang``;
    ``message``: the same as a keyed :class:`attnlab.messages.Message`
    (``exercise.<mistake>``), to render in the other language. ``mistake``: the key of
    the diagnosis ("ok", "not_written", "crashed", "shape", "no_scale",
    "softmax_axis"...), stable for tests and tools. ``case``: the input case that
    failed (``exercise.case.<case>`` in the catalog), or "" when passed.
    """

    name: str
    passed: bool
    hint: str
    mistake: str
    case: str
    lang: str
    message: Message

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        mark = "✓" if self.passed else "✗"
        return f"{mark} {self.name}: {self.hint}"

    def _repr_markdown_(self) -> str:
        mark = "✅" if self.passed else "❌"
        return f"{mark} **{self.name}**: {self.hint}"

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        mark = "✓" if self.passed else "✗"
        return (f'<div style="border-left:4px solid {colour};padding:4px 10px">'
                f'<b style="color:{colour}">{mark} {html.escape(self.name)}</b>: '
                f"{html.escape(self.hint)}</div>")


def names() -> list[str]:
    """The exercises, in the order of the lessons."""
    return list(EXERCISES)


def task(name: str, lang: str = "zh") -> str:
    """What exercise ``name`` asks for, and its signature with shapes."""
    exercise = _exercise(name)
    _check_lang(lang)
    return f"{exercise.task[LANGS.index(lang)]}\n{exercise.signature}"


def check(name: str, solution: Any, lang: str = "zh") -> Result:
    """Run ``solution`` on every case of exercise ``name`` and judge it against attnlab.

    Returns a :class:`Result` (it displays itself in a notebook); never raises on
    account of the solution. Raises AttnlabError for an unknown ``name`` or ``lang``.
    """
    exercise = _exercise(name)
    _check_lang(lang)
    if not callable(solution):
        return _result(exercise, "not_callable", "", lang, name=name,
                       kind=type(solution).__name__)
    cases = exercise.cases()
    for case in cases:
        verdict = _judge(exercise, solution, case, lang)
        if verdict is not None:
            return verdict
    return _result(exercise, "ok", "", lang, n=len(cases))


def _exercise(name: Any) -> Exercise:
    if not isinstance(name, str) or name not in EXERCISES:
        raise AttnlabError(f"name: expected one of {', '.join(EXERCISES)}, got {name!r}")
    return EXERCISES[name]


def _check_lang(lang: Any) -> None:
    if lang not in LANGS:
        raise AttnlabError(f"lang: expected 'zh' or 'en', got {lang!r}")


def _result(exercise: Exercise, key: str, case: str, lang: str, **params: Any) -> Result:
    if case:
        params["case"] = case
    message = hint(key, **params)
    return Result(exercise.name, key == "ok", message.render(lang), key, case, lang, message)


def _run(fn: Any, case: Case) -> tuple[Any, BaseException | None]:
    args = copy.deepcopy(case.args)  # a solution that writes into its inputs spoils nothing
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(*args), None
    except Exception as error:  # the learner's code may raise anything: report it
        return None, error


def _arrays(value: Any, count: int) -> list[np.ndarray] | None:
    """The returned value as ``count`` arrays, or None if it is not that."""
    items = list(value) if count > 1 and isinstance(value, (tuple, list)) else [value]
    if len(items) != count:
        return None
    try:
        return [np.asarray(item) for item in items]
    except Exception:
        return None


def _same(got: list[np.ndarray], want: list[np.ndarray], bool_output: bool) -> bool:
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or g.dtype == object:
            return False
        if bool_output and w.dtype == bool and g.dtype != bool:
            return False
        try:
            if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-6,
                               atol=1e-9, equal_nan=True):
                return False
        except (TypeError, ValueError):
            return False
    return True


def _judge(exercise: Exercise, solution: Any, case: Case, lang: str) -> Result | None:
    """None when the solution matches attnlab on ``case``, else the diagnosis."""
    expected = _arrays(_run(exercise.reference, case)[0], exercise.outputs)
    if expected is None:  # attnlab's own answer must exist: a defect of the catalog
        raise AttnlabError(f"exercise {exercise.name}: the reference failed on {case.label}")
    value, error = _run(solution, case)
    if isinstance(error, NotImplementedError):
        return _result(exercise, "not_written", case.label, lang)
    if error is not None:
        for mistake in exercise.mistakes:  # a mistake that fails the same way names it
            _, wrong_error = _run(mistake.fn, case)
            if type(wrong_error) is type(error) and str(wrong_error) == str(error):
                return _result(exercise, mistake.hint, case.label, lang)
        return _result(exercise, "crashed", case.label, lang,
                       error=f"{type(error).__name__}: {error}")
    got = _arrays(value, exercise.outputs)
    if got is None:
        key = "qkv_not_three" if exercise.outputs == 3 else "not_array"
        return _result(exercise, key, case.label, lang, kind=type(value).__name__)
    if _same(got, expected, exercise.bool_output):
        return None
    for mistake in exercise.mistakes:
        wrong = _arrays(_run(mistake.fn, case)[0], exercise.outputs)
        if wrong is not None and _same(got, wrong, exercise.bool_output):
            return _result(exercise, mistake.hint, case.label, lang)
    return _diagnose(exercise, got, expected, case, lang)


def _diagnose(exercise: Exercise, got: list[np.ndarray], expected: list[np.ndarray], case: Case,
              lang: str) -> Result:
    """No known mistake fits: say what is visibly wrong."""
    same_shapes = all(g.shape == w.shape for g, w in zip(got, expected, strict=True))
    if exercise.outputs == 3 and same_shapes:
        for order in ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)):
            if _same([got[i] for i in order], expected, False):
                return _result(exercise, "qkv_order", case.label, lang)
    for g, w in zip(got, expected, strict=True):
        if g.shape != w.shape:
            return _result(exercise, "shape", case.label, lang, expected=_shape(w.shape),
                           got=_shape(g.shape))
        if g.dtype == object or not np.issubdtype(g.dtype, np.number) and g.dtype != bool:
            return _result(exercise, "not_array", case.label, lang, kind=str(g.dtype))
        if w.dtype == bool and g.dtype != bool and np.array_equal(g.astype(bool), w):
            return _result(exercise, "mask_not_bool", case.label, lang)
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        if not np.isfinite(g64).all() and np.isfinite(w64).all():
            return _result(exercise, "nonfinite", case.label, lang)
        if exercise.name == "softmax" and np.isfinite(g64).all() and not np.allclose(
                g64.sum(-1), 1.0):
            return _result(exercise, "softmax_axis", case.label, lang)
    diff = max(float(np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64))))
               if g.size else 0.0 for g, w in zip(got, expected, strict=True))
    return _result(exercise, "wrong", case.label, lang, diff=diff)


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"
