"""The approximation study: what each sparse or low-rank method costs, and what it loses.

For every method and knob (window W, block size b, Linformer rows k, Nyström
landmarks m, Performer features M) and several lengths T, it measures against
exact attention (:func:`attnlab.scaled_dot_product_attention`):

- the relative Frobenius error of the output, ‖out − exact‖_F / ‖exact‖_F,
  against a float64 reference (the methods themselves run in float32);
- the time, the median of ``repeats`` runs interleaved with exact attention and
  every other method on the same input (:func:`attnlab.studies.measure.interleaved`);
- the peak memory allocated during one more run (``tracemalloc``, which NumPy
  reports its arrays to), inputs excluded.

Inputs (all non-causal self-attention, T == S):

- ``gaussian-uniform`` and ``gaussian-peaked``: q, k, v ~ N(0, 1) with q and k
  scaled so that the logits q·k/√D have standard deviation τ (0.5: near-uniform
  weights; 4: a few keys take most of each row). Uniform-looking attention makes
  every approximation look good, so both are reported, with each input's mean
  largest weight and normalised entropy;
- ``minilm``: the real Q, K, V of all 6 layers × 12 heads of all-MiniLM-L6-v2
  (D = 32) on real English sentences concatenated up to 256 tokens (the model's
  limit); shorter T take the first T tokens.

A separate *long-sequence* check times causal sliding-window attention
(W = 256) and the other causal methods against dense causal attention at
T = 16,384 (float32: a 1 GiB score matrix, computed once).

The methods are in :mod:`~attnlab.studies.approx_methods`; the summary, table and
plots in :mod:`~attnlab.studies.approx_report`. The library computes and returns;
:mod:`attnlab.cli.approx` prints and saves.
Dimension legend: B batch, H heads, T query length, S key length, D head dim.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..attention import scaled_dot_product_attention
from ..checks import check_positive_int
from ..errors import AttnlabError
from ..fast.block_sparse import block_sparse_attention
from ..fast.performer import orthogonal_random_features, performer_attention
from ..fast.sparse import sliding_window_attention
from ..kernel import MAX_SCORE_ELEMENTS
from ..messages import Message, msg
from .approx_methods import METHODS
from .approx_report import summarize
from .measure import environment, interleaved, limit_threads, peak_traced_bytes, traced_peak

__all__ = [
    "SCHEMA",
    "StudyConfig",
    "StudyInput",
    "capture_minilm_qkv",
    "gaussian_input",
    "run_study",
]

#: Version tag of the result (and of the JSON that ``approx_report.save_study`` writes).
SCHEMA = "attnlab.studies.approx/1"

#: Sentences concatenated for the MiniLM input (written for this study).
SENTENCES = (
    "The old library stood at the corner of the market square, and its windows caught the "
    "morning light.",
    "Every Saturday the farmers brought apples, cheese and fresh bread from the villages in "
    "the hills.",
    "A small boy asked his grandmother why the river looked brown after the storm.",
    "She explained that the rain had washed soil from the fields into the water.",
    "Scientists measure the temperature of the ocean with floating sensors that drift for "
    "years.",
    "The train to the coast was delayed by forty minutes because of a signal failure.",
    "Most passengers waited patiently, reading newspapers or talking quietly on their phones.",
    "In the kitchen, the chef tasted the soup, added a pinch of salt and nodded.",
    "Learning a second language changes the way people notice sounds they once ignored.",
    "The committee will publish its report on public transport next spring.",
    "After the concert, the musicians packed their instruments and walked slowly to the "
    "station.",
    "Bees visit thousands of flowers every day and carry pollen from one plant to another.",
    "The museum opened a new exhibition about the history of printing and paper.",
    "Engineers tested the bridge with heavy trucks before it was opened to traffic.",
    "He wrote a long letter to his brother, who had moved abroad many years earlier.",
    "The mountain path was steep, narrow and covered with loose stones after the winter.",
    "Children in the school garden planted beans, carrots and a row of sunflowers.",
    "The doctor advised him to sleep more, drink water and walk every afternoon.",
    "Our neighbours painted their front door bright yellow, and the whole street noticed.",
    "A sudden wind lifted the tablecloth and scattered the napkins across the lawn.",
    "The software update fixed a bug that had made the application crash on startup.",
    "Historians still argue about the causes of the war and the choices of its leaders.",
    "At night the harbour was quiet except for the creaking of ropes against the boats.",
    "The students compared their answers and found that two of them had made the same "
    "mistake.",
    "When the power returned, the refrigerator hummed and the lights flickered back on.",
    "The recipe calls for two eggs, a cup of flour and a spoonful of honey.",
)

#: Logit standard deviation τ of the two Gaussian inputs.
TEMPERATURES = (("gaussian-uniform", 0.5), ("gaussian-peaked", 4.0))


@dataclass(frozen=True)
class StudyConfig:
    """What the study runs. ``StudyConfig.quick()`` is the under-a-minute version."""

    lengths: tuple[int, ...] = (256, 1024, 4096)
    head_dim: int = 64
    temperatures: tuple[tuple[str, float], ...] = TEMPERATURES
    windows: tuple[int, ...] = (31, 127, 511)
    block_sizes: tuple[int, ...] = (16, 64)
    linformer_k: tuple[int, ...] = (32, 128, 256)
    nystrom_m: tuple[int, ...] = (16, 64, 256)
    performer_features: tuple[int, ...] = (64, 256, 1024)
    minilm: bool = True
    minilm_lengths: tuple[int, ...] = (128, 256)
    long_length: int | None = 16384
    long_window: int = 256
    repeats: int = 3
    seed: int = 0
    threads: int | None = 1

    @classmethod
    def quick(cls, **changes: Any) -> StudyConfig:
        """Two lengths, two values per knob, no long-sequence check."""
        settings: dict[str, Any] = dict(
            lengths=(256, 1024), windows=(31, 127), block_sizes=(16, 64),
            linformer_k=(32, 128), nystrom_m=(16, 64), performer_features=(64, 256),
            long_length=None, repeats=3,
        )
        settings.update(changes)
        return cls(**settings)

    def check(self) -> StudyConfig:
        """Raise AttnlabError naming the first bad setting."""
        for name in ("lengths", "windows", "block_sizes", "linformer_k", "nystrom_m",
                     "performer_features", "minilm_lengths"):
            values = getattr(self, name)
            if not isinstance(values, tuple) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in values):
                raise AttnlabError(f"{name}: expected a tuple of positive integers, got {values!r}")
        if not self.lengths and not (self.minilm and self.minilm_lengths):
            raise AttnlabError("lengths: expected at least one length to study, got none")
        if any(w % 2 == 0 for w in self.windows):
            raise AttnlabError(f"windows: expected odd symmetric windows, got {self.windows}")
        if any(t > 256 for t in self.minilm_lengths):
            raise AttnlabError(f"minilm_lengths: expected at most 256 (MiniLM's limit), "
                               f"got {self.minilm_lengths}")
        longest = [("lengths", T) for T in self.lengths]
        if self.long_length is not None:
            longest.append(("long_length", self.long_length))
        for name, T in longest:
            if isinstance(T, int) and T * T > MAX_SCORE_ELEMENTS:  # exact attention is the baseline
                raise AttnlabError(
                    f"{name}: exact attention at T = {T} needs a {T}×{T} score matrix, more than "
                    f"attnlab.attention.MAX_SCORE_ELEMENTS = {MAX_SCORE_ELEMENTS:,}; expected "
                    f"T <= {math.isqrt(MAX_SCORE_ELEMENTS)}"
                )
        check_positive_int(self.head_dim, "head_dim")
        check_positive_int(self.repeats, "repeats")
        check_positive_int(self.seed, "seed", allow_zero=True)
        check_positive_int(self.long_window, "long_window")
        if self.long_length is not None:
            check_positive_int(self.long_length, "long_length")
        if self.threads is not None:
            check_positive_int(self.threads, "threads")
        return self


# ---------------------------------------------------------------------- the methods


# ------------------------------------------------------------------------ the inputs


@dataclass
class StudyInput:
    """One input: q, k, v float32 (B, T, D) and the float64 exact output (B, T, Dv)."""

    name: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    exact: np.ndarray
    stats: dict[str, float] = field(default_factory=dict)


def _make_input(name: str, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> StudyInput:
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    exact, weights = scaled_dot_product_attention(q64, k64, v64, return_weights=True)
    T = weights.shape[-1]
    entropy = -np.sum(weights * np.log(np.maximum(weights, 1e-300)), axis=-1)  # (B, T)
    mean_v = np.broadcast_to(v64.mean(axis=-2, keepdims=True), exact.shape)  # (B, T, Dv)
    stats = {
        "mean_max_weight": float(weights.max(axis=-1).mean()),
        "normalised_entropy": float(entropy.mean() / np.log(T)) if T > 1 else 0.0,
        # The error of a method that ignores q and k and outputs the mean of V:
        # a floor any approximation should beat (outputting zeros scores 1).
        "mean_v_error": _relative_error(mean_v, exact),
    }
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    return StudyInput(name, q32, k32, v32, exact=exact, stats=stats)


def gaussian_input(name: str, T: int, D: int, temperature: float, seed: int) -> StudyInput:
    """q, k, v (1, T, D): q·k/√D has standard deviation ``temperature``."""
    rng = np.random.default_rng([seed, T, int(temperature * 1000)])
    amplitude = math.sqrt(temperature)  # Var(q·k/√D) = amplitude⁴ for unit Gaussians
    q = amplitude * rng.standard_normal((1, T, D))  # (1, T, D)
    k = amplitude * rng.standard_normal((1, T, D))  # (1, T, D)
    v = rng.standard_normal((1, T, D))  # (1, T, D)
    return _make_input(name, q, k, v)


def capture_minilm_qkv(max_tokens: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                         list[str]]:
    """Real Q, K, V of all-MiniLM-L6-v2 on :data:`SENTENCES`: -> three (L·H, T, 32), tokens.

    The sentences are joined into one text (more than 256 tokens), run through
    the model once (which truncates at its limit of 256), keeping Q, K and V of
    every layer and head; the first ``max_tokens`` rows are returned. (They were
    computed with the whole 256-token context: as inputs to attention they are
    real vectors either way.) Needs the ``minilm`` extra.
    """
    max_tokens = check_positive_int(max_tokens, "max_tokens")
    from ..models import load_minilm

    model = load_minilm()
    trace = model.run(" ".join(SENTENCES), keep=("Q", "K", "V"))
    if max_tokens > len(trace.tokens):
        raise AttnlabError(f"max_tokens: expected at most {len(trace.tokens)} (the model's "
                           f"limit), got {max_tokens}")
    stacked = [np.stack([s.values[:max_tokens] for s in trace.steps if s.key == key])
               for key in ("Q", "K", "V")]  # (L·H, T, 32) each
    return stacked[0], stacked[1], stacked[2], trace.tokens[:max_tokens]


# ---------------------------------------------------------------------- measuring


def _measure(calls: dict[str, Callable[[], np.ndarray]], repeats: int,
             progress: Callable[[Message], None], where: str
             ) -> dict[str, tuple[np.ndarray, float, int]]:
    """name -> (output, median seconds, peak bytes): a warm-up run that gives the output,
    ``repeats`` interleaved timed rounds, then one traced run per call."""
    outputs = {}
    for name, call in calls.items():
        progress(msg("approx.progress.call", where=where, name=name))
        outputs[name] = call()
    progress(msg("approx.progress.timing", where=where, calls=len(calls), rounds=repeats))
    timings = interleaved(calls, repeats)
    return {name: (outputs[name], timings[name].median, peak_traced_bytes(calls[name]))
            for name in calls}


def _relative_error(out: np.ndarray, exact: np.ndarray) -> float:
    norm = float(np.linalg.norm(exact))
    diff = float(np.linalg.norm(out.astype(np.float64) - exact))
    return diff / norm if norm else diff


def _study_input(inp: StudyInput, config: StudyConfig,
                 progress: Callable[[Message], None]) -> list[dict[str, Any]]:
    B, T, D = inp.q.shape
    calls: dict[str, Callable[[], np.ndarray]] = {
        "exact": lambda: scaled_dot_product_attention(inp.q, inp.k, inp.v)}
    settings: dict[str, tuple[Any, int]] = {}
    for method in METHODS:
        for value in getattr(config, method.values_field):
            if method.useful(value, T):
                name = f"{method.name} {method.knob}={value}"
                calls[name] = method.prepare(inp.q, inp.k, inp.v, value, config.seed)
                settings[name] = (method, value)
    measured = _measure(calls, config.repeats, progress, f"{inp.name} T={T}")
    _, exact_time, exact_peak = measured["exact"]
    base = {"input": inp.name, "T": T, "B": B, "D": D}
    records = [{**base, "method": "exact", "knob": None, "value": None, "rel_error": 0.0,
                "time_s": exact_time, "peak_bytes": exact_peak, "time_vs_exact": 1.0,
                "memory_vs_exact": 1.0}]
    for name, (method, value) in settings.items():
        out, seconds, peak = measured[name]
        records.append({
            **base, "method": method.name, "knob": method.knob, "value": value,
            "rel_error": _relative_error(out, inp.exact), "time_s": seconds,
            "peak_bytes": peak, "time_vs_exact": seconds / exact_time,
            "memory_vs_exact": peak / exact_peak if exact_peak else math.inf,
        })
    return records


def _long_sequence(config: StudyConfig, T: int,
                   progress: Callable[[Message], None]) -> dict[str, Any]:
    """Causal methods against dense causal attention at length T (float32).

    Dense runs once (its time and its peak memory come from the same traced
    run: tracemalloc's cost is per allocation, negligible for a few GiB-sized
    arrays); its float32 output is the reference for the errors.
    """
    D = config.head_dim
    rng = np.random.default_rng([config.seed, T])
    amplitude = math.sqrt(TEMPERATURES[0][1])
    q, k = (amplitude * rng.standard_normal((T, D)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((T, D)).astype(np.float32)
    progress(msg("approx.progress.dense", T=T))
    start = time.perf_counter()
    with traced_peak() as traced:
        dense = scaled_dot_product_attention(q, k, v, is_causal=True)
    dense_time = time.perf_counter() - start
    omega = orthogonal_random_features(256, D, seed=config.seed).astype(np.float32)
    calls = {
        ("sliding_window", "W", config.long_window):
            lambda: sliding_window_attention(q, k, v, config.long_window, is_causal=True),
        ("block_sparse", "b", 64):
            lambda: block_sparse_attention(q, k, v, 64, seed=config.seed, is_causal=True),
        ("performer", "M", 256):
            lambda: performer_attention(q, k, v, projection=omega, is_causal=True),
    }
    named = {f"{name} {knob}={value} (causal)": call
             for (name, knob, value), call in calls.items()}
    measured = _measure(named, config.repeats, progress, f"long T={T}")
    rows: list[dict[str, Any]] = []
    for (name, knob, value), label in zip(calls, named, strict=True):
        out, seconds, peak = measured[label]
        rows.append({"method": name, "knob": knob, "value": value, "causal": True,
                     "time_s": seconds, "peak_bytes": peak,
                     "speedup_vs_dense": dense_time / seconds,
                     "memory_vs_dense": peak / traced["peak"] if traced["peak"] else math.inf,
                     "rel_error_vs_dense": _relative_error(out, dense.astype(np.float64))})
    window_row = rows[0]
    return {
        "T": T, "D": D, "dtype": "float32", "input": TEMPERATURES[0][0],
        "dense": {"time_s": dense_time, "peak_bytes": traced["peak"], "runs": 1},
        "methods": rows,
        "target": {"method": "sliding_window", "W": config.long_window,
                   "required_speedup": 10.0, "speedup": window_row["speedup_vs_dense"],
                   "met": window_row["speedup_vs_dense"] >= 10.0},
    }


def run_study(config: StudyConfig | None = None, *,
              progress: Callable[[Message], None] | None = None) -> dict[str, Any]:
    """Run the study; returns the JSON-ready result (see :data:`SCHEMA`).

    ``progress`` (optional) receives a line before each measurement, as a keyed
    :class:`~attnlab.messages.Message` (``str()`` is the English, ``.render("zh")``
    the Chinese); the library itself prints nothing. Keys of the result: ``schema``, ``config``,
    ``environment``, ``inputs`` (per input and T: mean largest weight and
    normalised entropy of exact attention), ``records`` (one per input, T,
    method, knob value; ``method == "exact"`` is the baseline), ``long_sequence``
    (or None) and ``summary`` (per method: the plain statement of where it is
    worse than exact attention, with the numbers).
    """
    config = (config or StudyConfig()).check()
    say = progress or (lambda line: None)
    records: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    started = time.perf_counter()
    with limit_threads(config.threads, feature="Limiting BLAS threads (threads=)"):
        for name, temperature in config.temperatures:
            for T in config.lengths:
                inp = gaussian_input(name, T, config.head_dim, temperature, config.seed)
                inputs.append({"input": name, "T": T, "temperature": temperature, **inp.stats})
                records += _study_input(inp, config, say)
        if config.minilm and config.minilm_lengths:
            say(msg("approx.progress.minilm"))
            q, k, v, tokens = capture_minilm_qkv(max(config.minilm_lengths))
            for T in config.minilm_lengths:
                if T > q.shape[-2]:
                    continue
                inp = _make_input("minilm", q[:, :T], k[:, :T], v[:, :T])
                inputs.append({"input": "minilm", "T": T, "temperature": None, **inp.stats,
                               "first_tokens": tokens[:12]})
                records += _study_input(inp, config, say)
        long_result = (None if config.long_length is None
                       else _long_sequence(config, config.long_length, say))
    return {
        "schema": SCHEMA,
        "config": asdict(config),
        "environment": {
            **environment(config.threads), "blas_threads": config.threads,
            "dtype": "float32 (errors against a float64 reference)",
            "seconds": time.perf_counter() - started,
        },
        "inputs": inputs,
        "records": records,
        "long_sequence": long_result,
        "summary": summarize(records, inputs, long_result),
    }
