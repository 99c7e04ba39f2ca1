"""``attnlab.hf.verify``: where does a Hugging Face model's attention part from exact, and is
it rounding or a bug?

The same inputs (a padded batch included) run through copies of the model:

- the **reference**: attnlab's plain path in float64 (:func:`attnlab.hf.register` with
  ``backend="plain"``), the model's weights cast to float64;
- **eager**, transformers' own written-out attention, in the model's dtype: the
  baseline of what rounding alone does (it is the "reference implementation in the
  same precision" of FlashAttention's tests);
- **sdpa** (transformers' torch sdpa, where the model has it) and **attnlab**
  (attnlab's fused torch path), in the model's dtype: the candidates.

For each layer's output (the hidden states, real tokens only) and each layer's and
head's weights (real query rows), the largest absolute difference from the reference.
FlashAttention's rule decides: a candidate is within rounding at a layer when its
error is at most **twice eager's** there (plus a floor of a few ulps of the values'
size, for layers where eager happens to be exact), for the hidden states and, where
the candidate returns weights (``output_attentions``; sdpa returns none), for the
worst head's weights too. The first layer past that is where
the candidate disagrees, and then the verdict is "bug": a difference that rounding in
this dtype does not explain. Where eager is no baseline (its output is NaN or inf on
real tokens, as in float64 under left padding for models that upcast their softmax to
float32), sdpa stands in and the report says so.

Dimension legend: B batch, H heads, T tokens, L layers.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..errors import AttnlabError
from .register import register

__all__ = ["CANDIDATES", "LayerErrors", "VerifyReport", "verify"]

#: The implementations compared with the float64 reference, besides eager.
CANDIDATES = ("sdpa", "attnlab")
_REFERENCE_NAME = "attnlab_plain"
_FUSED_NAME = "attnlab"
_ULP_FLOOR = 8  # ulps of the values' size allowed where eager's error is 0


@dataclass
class LayerErrors:
    """One layer's largest errors against the float64 reference (None: not available)."""

    layer: int  # 0 = the embeddings, l = the output of layer l
    hidden: dict[str, float | None]  # implementation -> max |h - h_ref| over real tokens
    budget: float  # 2 × the baseline's error, or the ulp floor if larger
    pattern: dict[str, list[float]] = field(default_factory=dict)  # impl -> per head (layers ≥ 1)
    pattern_budget: float | None = None  # 2 × eager's worst head, or the ulp floor


@dataclass
class VerifyReport:
    """What :func:`verify` found; :meth:`to_json` is the CLI's ``--json``."""

    model: str
    dtype: str
    batch: int
    tokens: int
    padded: bool
    baseline: str  # "eager", or "sdpa" where eager is not finite
    layers: list[LayerErrors]
    first_disagreement: dict[str, int | None]  # candidate -> first layer past the budget
    verdict: dict[str, str]  # candidate -> "rounding" | "bug" | "unavailable"
    notes: list[str]  # keys of facts worth saying (see the CLI's words)

    def to_json(self) -> dict[str, Any]:
        """A dict of plain values; a non-finite error (NaN or inf in that output) is None."""
        return _finite(asdict(self))


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def verify(model: Any, inputs: dict[str, Any], *,
           candidates: tuple[str, ...] = CANDIDATES) -> VerifyReport:
    """Run ``model`` on ``inputs`` on attnlab's float64 plain path, eager, sdpa and attnlab's
    fused path; compare every layer and head with the float64 run (see the module docs).

    ``inputs``: the forward's keyword arguments (``input_ids`` (B, T) and
    ``attention_mask`` (B, T), 1 = a real token). ``model`` is not changed: each run
    uses a copy. ``candidates``: implementation names registered with transformers
    ("attnlab" is attnlab's fused path, registered here); one the model does not support
    is reported "unavailable".
    """
    if not isinstance(inputs, dict) or "input_ids" not in inputs:
        raise AttnlabError(f"inputs: expected the forward's keyword arguments with input_ids, "
                           f"got {type(inputs).__name__}")
    if isinstance(candidates, str) or not all(isinstance(c, str) for c in candidates) \
            or "eager" in candidates:
        raise AttnlabError(f"candidates: expected a tuple of attention implementation names "
                           f"other than eager (the baseline), got {candidates!r}")
    register(_REFERENCE_NAME, backend="plain")
    register(_FUSED_NAME, backend="torch")
    ids = inputs["input_ids"]
    real = inputs.get("attention_mask")
    real = torch.ones_like(ids, dtype=torch.bool) if real is None else real.bool()  # (B, T)
    dtype = next(model.parameters()).dtype

    reference = _run(model, _REFERENCE_NAME, torch.float64, inputs, weights=True)
    assert reference is not None  # attnlab's own implementation always runs
    runs = {"eager": _run(model, "eager", dtype, inputs, weights=True)}
    for name in candidates:
        implementation = _FUSED_NAME if name == "attnlab" else name
        fused = _run(model, implementation, dtype, inputs, weights=False)
        if fused is not None:  # its weights, where it gives them (sdpa does not)
            with_weights = _run(model, implementation, dtype, inputs, weights=True)
            fused = (fused[0], with_weights[1] if with_weights else None)
        runs[name] = fused

    notes: list[str] = []
    baseline = "eager"
    eager = runs["eager"]
    if eager is None or not all(torch.isfinite(h[real]).all() for h in eager[0]):
        notes.append("eager_not_finite")
        baseline = "sdpa" if runs.get("sdpa") is not None else "none"
    for name in candidates:
        if runs.get(name) is None:
            notes.append(f"{name}_unavailable")

    eps = torch.finfo(dtype).eps
    layers: list[LayerErrors] = []
    ref_hidden, ref_weights = reference
    for index, ref_h in enumerate(ref_hidden):
        hidden = {name: (None if run is None else _max_error(run[0][index], ref_h, real))
                  for name, run in runs.items()}
        base = hidden.get(baseline)
        floor = _ULP_FLOOR * eps * max(1.0, float(ref_h[real].abs().max()))
        budget = max(2.0 * base, floor) if base is not None and math.isfinite(base) else floor
        errors = LayerErrors(index, hidden, budget)
        if index >= 1 and ref_weights is not None:
            for name, run in runs.items():
                if run is not None and run[1] is not None:
                    errors.pattern[name] = _head_errors(run[1][index - 1],
                                                        ref_weights[index - 1], real)
            eager_heads = errors.pattern.get("eager")
            if eager_heads and all(math.isfinite(e) for e in eager_heads):
                errors.pattern_budget = max(2.0 * max(eager_heads), _ULP_FLOOR * eps)
        layers.append(errors)

    first: dict[str, int | None] = {}
    verdict: dict[str, str] = {}
    for name in candidates:
        if runs.get(name) is None:
            first[name], verdict[name] = None, "unavailable"
            continue
        past = [e.layer for e in layers if not _within(e, name)]
        first[name] = past[0] if past else None
        verdict[name] = "bug" if past else "rounding"
    B, T = ids.shape
    return VerifyReport(type(model).__name__, str(dtype).replace("torch.", ""), int(B), int(T),
                        bool((~real).any()), baseline, layers, first, verdict, notes)


def _within(errors: LayerErrors, name: str) -> bool:
    """Whether ``name``'s hidden states (and weights, where both it and eager give them) are
    within the layer's rounding budget."""
    hidden = errors.hidden[name]
    if hidden is None or not hidden <= errors.budget:
        return False
    heads = errors.pattern.get(name)
    return errors.pattern_budget is None or not heads or max(heads) <= errors.pattern_budget


def _run(model: Any, implementation: str, dtype: torch.dtype, inputs: dict[str, Any],
         *, weights: bool) -> tuple[list[torch.Tensor], list[torch.Tensor] | None] | None:
    """(hidden states per layer, weights per layer or None) of a copy of ``model`` on
    ``implementation`` in ``dtype`` (float64 results), or None where the model has no
    such implementation."""
    twin = copy.deepcopy(model).to(dtype).eval()
    try:
        twin.set_attn_implementation(implementation)
    except (ValueError, ImportError, KeyError):  # e.g. GPT-OSS has no sdpa
        return None
    if dtype == torch.float64 and hasattr(twin, "set_experts_implementation"):
        try:  # torch's grouped_mm (mixture-of-experts models) has no float64
            twin.set_experts_implementation("eager")
        except (ValueError, ImportError):
            pass
    with torch.no_grad():
        out = twin(**inputs, output_hidden_states=True, output_attentions=weights)
    hidden = [h.to(torch.float64) for h in out.hidden_states]
    attentions = getattr(out, "attentions", None) if weights else None
    if attentions is not None and (len(attentions) != len(hidden) - 1
                                   or any(a is None for a in attentions)):
        attentions = None  # sdpa gives none (an empty tuple, or Nones)
    return hidden, (None if attentions is None else [a.to(torch.float64) for a in attentions])


def _max_error(got: torch.Tensor, want: torch.Tensor, real: torch.Tensor) -> float:
    """max |got - want| over real tokens (B, T, E); inf if got is not finite there."""
    diff = (got - want)[real]  # (N, E)
    if not torch.isfinite(diff).all():
        return math.inf
    return float(diff.abs().max()) if diff.numel() else 0.0


def _head_errors(got: torch.Tensor, want: torch.Tensor, real: torch.Tensor) -> list[float]:
    """Per head, max |got - want| of the weights (B, H, T, S) over real query rows."""
    rows = real[:, None, :, None]  # (B, 1, T, 1)
    diff = (got - want).abs().masked_fill(~rows, 0.0)  # (B, H, T, S)
    diff = torch.where(torch.isfinite(diff), diff, torch.full_like(diff, math.inf))
    return [float(v) for v in diff.amax(dim=(0, 2, 3))]
