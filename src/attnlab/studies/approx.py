"""The approximation study: what each sparse or low-rank method costs, and what it loses.

For every method and knob (window W, block size b, Linformer rows k, Nyström
landmarks m, Performer features M) and several lengths T, it measures against
exact attention (:func:`attnlab.scaled_dot_product_attention`):

- the relative Frobenius error of the output, ‖out − exact‖_F / ‖exact‖_F,
  against a float64 reference (the methods themselves run in float32);
- the time, best of ``repeats`` runs (``time.perf_counter``);
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

The library computes and returns; :mod:`attnlab.cli.approx` prints and saves.
Dimension legend: B batch, H heads, T query length, S key length, D head dim.
"""

from __future__ import annotations

import contextlib
import json
import math
import platform
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..attention import MAX_SCORE_ELEMENTS, scaled_dot_product_attention
from ..errors import AttnlabError, check_positive_int, missing_extra
from ..fast.lowrank import (
    linformer_attention,
    linformer_projection,
    nystrom_attention,
    orthogonal_random_features,
    performer_attention,
)
from ..fast.sparse import block_sparse_attention, block_sparse_mask, sliding_window_attention

__all__ = [
    "SCHEMA",
    "StudyConfig",
    "METHODS",
    "capture_minilm_qkv",
    "run_study",
    "format_table",
    "save_study",
]

#: Version tag of the JSON written by :func:`save_study`.
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

_LABELS = {
    "sliding_window": "sliding window (symmetric, W keys)",
    "block_sparse": "block-sparse (BigBird: 3 local, 1 global, 2 random blocks of b)",
    "linformer": "Linformer (random Gaussian E, F to k rows, untrained)",
    "linformer_pool": "Linformer with mean pooling to k rows (E = F = segment means)",
    "nystrom": "Nyström (m segment-mean landmarks, 6-step pseudo-inverse)",
    "performer": "Performer FAVOR+ (M positive orthogonal random features)",
}


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


@contextlib.contextmanager
def _traced_peak() -> Iterator[dict[str, int]]:
    """Peak bytes allocated inside the block (above what was live at its start).

    Starts tracemalloc if it was off and stops it again; if it was already on,
    only its peak is reset.
    """
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    result = {"peak": 0}
    try:
        yield result
    finally:
        result["peak"] = max(0, tracemalloc.get_traced_memory()[1] - baseline)
        if not was_tracing:
            tracemalloc.stop()


def _measure(call: Callable[[], np.ndarray], repeats: int) -> tuple[np.ndarray, float, int]:
    """(output, best time in s, peak bytes): a warm-up run, ``repeats`` timed, one traced."""
    out = call()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    with _traced_peak() as traced:
        call()
    return out, best, traced["peak"]


def _relative_error(out: np.ndarray, exact: np.ndarray) -> float:
    norm = float(np.linalg.norm(exact))
    diff = float(np.linalg.norm(out.astype(np.float64) - exact))
    return diff / norm if norm else diff


@contextlib.contextmanager
def _blas_threads(threads: int | None) -> Iterator[None]:
    if threads is None:
        yield
        return
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise missing_extra("threadpoolctl", "bench", "Limiting BLAS threads (threads=)") from None
    with threadpool_limits(limits=threads):
        yield


def _study_input(inp: StudyInput, config: StudyConfig,
                 progress: Callable[[str], None]) -> list[dict[str, Any]]:
    B, T, D = inp.q.shape
    progress(f"{inp.name} T={T}: exact")
    _, exact_time, exact_peak = _measure(
        lambda: scaled_dot_product_attention(inp.q, inp.k, inp.v), config.repeats)
    base = {"input": inp.name, "T": T, "B": B, "D": D}
    records = [{**base, "method": "exact", "knob": None, "value": None, "rel_error": 0.0,
                "time_s": exact_time, "peak_bytes": exact_peak, "time_vs_exact": 1.0,
                "memory_vs_exact": 1.0}]
    for method in METHODS:
        for value in getattr(config, method.values_field):
            if not method.useful(value, T):
                continue
            progress(f"{inp.name} T={T}: {method.name} {method.knob}={value}")
            call = method.prepare(inp.q, inp.k, inp.v, value, config.seed)
            out, seconds, peak = _measure(call, config.repeats)
            records.append({
                **base, "method": method.name, "knob": method.knob, "value": value,
                "rel_error": _relative_error(out, inp.exact), "time_s": seconds,
                "peak_bytes": peak, "time_vs_exact": seconds / exact_time,
                "memory_vs_exact": peak / exact_peak if exact_peak else math.inf,
            })
    return records


def _long_sequence(config: StudyConfig, T: int,
                   progress: Callable[[str], None]) -> dict[str, Any]:
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
    progress(f"long T={T}: dense causal attention (a {T}×{T} float32 score matrix, once)")
    start = time.perf_counter()
    with _traced_peak() as traced:
        dense = scaled_dot_product_attention(q, k, v, is_causal=True)
    dense_time = time.perf_counter() - start
    omega = orthogonal_random_features(256, D, seed=config.seed).astype(np.float32)
    calls = [
        ("sliding_window", "W", config.long_window,
         lambda: sliding_window_attention(q, k, v, config.long_window, is_causal=True)),
        ("block_sparse", "b", 64,
         lambda: block_sparse_attention(q, k, v, 64, seed=config.seed, is_causal=True)),
        ("performer", "M", 256, lambda: performer_attention(q, k, v, projection=omega,
                                                            is_causal=True)),
    ]
    rows: list[dict[str, Any]] = []
    for name, knob, value, call in calls:
        progress(f"long T={T}: {name} {knob}={value} (causal)")
        out, seconds, peak = _measure(call, config.repeats)
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
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the study; returns the JSON-ready result (see :data:`SCHEMA`).

    ``progress`` (optional) receives a line before each measurement; the
    library itself prints nothing. Keys of the result: ``schema``, ``config``,
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
    with _blas_threads(config.threads):
        for name, temperature in config.temperatures:
            for T in config.lengths:
                inp = gaussian_input(name, T, config.head_dim, temperature, config.seed)
                inputs.append({"input": name, "T": T, "temperature": temperature, **inp.stats})
                records += _study_input(inp, config, say)
        if config.minilm and config.minilm_lengths:
            say("minilm: capturing Q, K, V of all-MiniLM-L6-v2")
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
            "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "blas_threads": config.threads,
            "dtype": "float32 (errors against a float64 reference)",
            "seconds": time.perf_counter() - started,
        },
        "inputs": inputs,
        "records": records,
        "long_sequence": long_result,
        "summary": summarize(records, inputs, long_result),
    }


# ---------------------------------------------------------------------- summaries


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def summarize(records: list[dict[str, Any]], inputs: list[dict[str, Any]],
              long_result: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Per method: where it is worse than exact attention (error, time, memory), in numbers.

    Returns {method: {"statement": str, "worst_error": {...}, "worse_than_mean_v":
    [...], "slower": [...], "more_memory": [...], "faster_from_T": {knob value:
    T or None}}}. "worse_than_mean_v" lists the runs whose error exceeds that of
    outputting the mean of V for every query (the input's ``mean_v_error``).
    """
    exact = {(r["input"], r["T"]): r for r in records if r["method"] == "exact"}
    floor = {(i["input"], i["T"]): i["mean_v_error"] for i in inputs}
    out: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        rows = [r for r in records if r["method"] == method.name]
        if not rows:
            continue
        worst = max(rows, key=lambda r: r["rel_error"])
        by_input: dict[str, list[float]] = {}
        for r in rows:
            by_input.setdefault(r["input"], []).append(r["rel_error"])
        useless = [r for r in rows if r["rel_error"] > floor.get((r["input"], r["T"]), math.inf)]
        slower = [r for r in rows if r["time_vs_exact"] > 1.0]
        heavier = [r for r in rows if r["memory_vs_exact"] > 1.0]
        # Break-even lengths on the Gaussian inputs (one shape: B = 1, D as configured);
        # MiniLM's inputs (72 heads, D = 32) are a different workload.
        gaussian = [r for r in rows if r["input"].startswith("gaussian")]
        faster_from: dict[str, int | None] = {}
        for value in sorted({r["value"] for r in gaussian}):
            lengths = sorted({r["T"] for r in gaussian if r["value"] == value})
            winning = [T for T in lengths if all(r["time_vs_exact"] < 1.0 for r in gaussian
                                                 if r["value"] == value and r["T"] == T)]
            # the smallest T from which every measured longer T is also faster
            first = next((T for i, T in enumerate(lengths)
                          if all(t in winning for t in lengths[i:])), None)
            faster_from[str(value)] = first

        parts = [f"{_LABELS[method.name]}:"]
        if method.kind == "sparse":
            parts.append("exact for its own pattern, but against full attention")
        parts.append(
            "relative error " + "; ".join(
                f"{name} {min(errs):.2g}–{max(errs):.2g}" for name, errs in by_input.items())
            + f" (worst {worst['rel_error']:.3g}: {worst['input']}, T={worst['T']}, "
            f"{method.knob}={worst['value']}).")
        if useless:
            parts.append(
                f"Worse than ignoring q and k and outputting the mean of V in {len(useless)} "
                f"of {len(rows)} runs (" + "; ".join(
                    f"{name}: {sum(r['input'] == name for r in useless)} of "
                    f"{sum(r['input'] == name for r in rows)}" for name in by_input
                    if any(r["input"] == name for r in useless)) + ").")
        if slower:
            slowest = max(slower, key=lambda r: r["time_vs_exact"])
            cases = sorted({(r["T"], r["value"]) for r in slower})
            parts.append(
                f"Slower than exact attention in {len(cases)} of "
                f"{len({(r['T'], r['value']) for r in rows})} (T, {method.knob}) settings on "
                f"some input, worst {slowest['time_vs_exact']:.3g}× "
                f"({_fmt_ms(slowest['time_s'])} vs "
                f"{_fmt_ms(exact[(slowest['input'], slowest['T'])]['time_s'])}: "
                f"{slowest['input']}, T={slowest['T']}, {method.knob}={slowest['value']}).")
        else:
            parts.append("Never slower than exact attention in these runs.")
        never = [v for v, T in faster_from.items() if T is None]
        wins = [f"{method.knob}={v} from T={T}" for v, T in faster_from.items() if T is not None]
        if wins:
            parts.append("On the Gaussian inputs, faster than exact at every T measured from: "
                         + ", ".join(wins) + ".")
        if never:
            parts.append(f"On the Gaussian inputs, not faster at the longest T measured for "
                         f"{method.knob} = " + ", ".join(never) + ".")
        if heavier:
            heaviest = max(heavier, key=lambda r: r["memory_vs_exact"])
            parts.append(
                f"More peak memory than exact in {len(heavier)} of {len(rows)} runs, worst "
                f"{heaviest['memory_vs_exact']:.3g}× ({heaviest['peak_bytes'] / 2**20:.3g} MiB: "
                f"{heaviest['input']}, T={heaviest['T']}, {method.knob}={heaviest['value']}).")
        if long_result is not None:
            for row in long_result["methods"]:
                if row["method"] == method.name:
                    parts.append(
                        f"At T={long_result['T']} (causal, {row['knob']}={row['value']}): "
                        f"{row['speedup_vs_dense']:.3g}× faster than dense "
                        f"({_fmt_ms(row['time_s'])} vs "
                        f"{_fmt_ms(long_result['dense']['time_s'])}), "
                        f"{row['memory_vs_dense']:.2g}× its memory, error "
                        f"{row['rel_error_vs_dense']:.2g}.")
        out[method.name] = {
            "statement": " ".join(parts),
            "worst_error": {k: worst[k] for k in ("input", "T", "value", "rel_error")},
            "worse_than_mean_v": [{k: r[k] for k in ("input", "T", "value", "rel_error")}
                                  for r in useless],
            "slower": [{k: r[k] for k in ("input", "T", "value", "time_vs_exact")}
                       for r in slower],
            "more_memory": [{k: r[k] for k in ("input", "T", "value", "memory_vs_exact")}
                            for r in heavier],
            "faster_from_T": faster_from,
        }
    return out


def format_table(result: dict[str, Any]) -> str:
    """The records as an aligned text table, then the long-sequence check and the summary."""
    header = ("input", "T", "method", "knob", "rel.error", "time", "×exact", "peak MiB",
              "×exact")
    rows = [header]
    for r in result["records"]:
        knob = "" if r["knob"] is None else f"{r['knob']}={r['value']}"
        rows.append((r["input"], str(r["T"]), r["method"], knob, f"{r['rel_error']:.3g}",
                     _fmt_ms(r["time_s"]), f"{r['time_vs_exact']:.2f}",
                     f"{r['peak_bytes'] / 2**20:.3g}", f"{r['memory_vs_exact']:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 4 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("inputs (exact attention): " + "; ".join(
        f"{i['input']} T={i['T']}: mean max weight {i['mean_max_weight']:.3g}, "
        f"entropy/log T {i['normalised_entropy']:.3g}, error of outputting mean(V) "
        f"{i['mean_v_error']:.3g}" for i in result["inputs"]))
    long_result = result.get("long_sequence")
    if long_result:
        dense = long_result["dense"]
        lines.append("")
        lines.append(f"long sequence T={long_result['T']} D={long_result['D']} float32, causal: "
                     f"dense {_fmt_ms(dense['time_s'])}, peak "
                     f"{dense['peak_bytes'] / 2**20:.4g} MiB")
        for row in long_result["methods"]:
            lines.append(f"  {row['method']} {row['knob']}={row['value']}: "
                         f"{_fmt_ms(row['time_s'])} ({row['speedup_vs_dense']:.3g}× faster), "
                         f"peak {row['peak_bytes'] / 2**20:.3g} MiB, "
                         f"error vs dense {row['rel_error_vs_dense']:.2g}")
        target = long_result["target"]
        lines.append(f"  target W={target['W']} ≥ {target['required_speedup']:g}× faster: "
                     f"{'met' if target['met'] else 'NOT met'} ({target['speedup']:.3g}×)")
    lines.append("")
    lines.append("Where each method is worse than exact attention:")
    for entry in result["summary"].values():
        lines.append("- " + entry["statement"])
    return "\n".join(lines)


# ------------------------------------------------------------------------ saving


def _figure(ncols: int, width: float = 5.0, height: float = 4.2) -> Any:
    from ..report.figures import new_figure

    fig = new_figure((width * ncols, height))
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


_COLOURS = {"exact": "black", "sliding_window": "tab:blue", "block_sparse": "tab:cyan",
            "linformer": "tab:red", "linformer_pool": "tab:orange",
            "nystrom": "tab:green", "performer": "tab:purple"}
_MARKERS = "osD^v<>p*h"


def _plot_error_vs_cost(result: dict[str, Any], cost: str, label: str) -> Any:
    from matplotlib.ticker import NullFormatter

    records = [r for r in result["records"] if r["method"] != "exact"]
    names = list(dict.fromkeys(r["input"] for r in result["records"]))
    lengths = sorted({r["T"] for r in result["records"]})
    fig, axes = _figure(max(1, len(names)))
    for ax, name in zip(axes, names, strict=False):  # no input: one empty panel
        for method in METHODS:
            rows = [r for r in records if r["input"] == name and r["method"] == method.name]
            for r in rows:
                ax.scatter(r[cost], max(r["rel_error"], 1e-8), color=_COLOURS[method.name],
                           marker=_MARKERS[lengths.index(r["T"]) % len(_MARKERS)], s=36,
                           label=method.name if r is rows[0] else None)
                ax.annotate(f"{r['knob']}={r['value']}", (r[cost], max(r["rel_error"], 1e-8)),
                            fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
        floors = [i["mean_v_error"] for i in result["inputs"] if i["input"] == name]
        for floor in floors:
            ax.axhline(floor, color="grey", linestyle=":", linewidth=0.8,
                       label="output mean(V) (per T)" if floor == floors[0] else None)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # short log ranges: no clutter
        ax.set_title(name)
        ax.set_xlabel(f"{label} ÷ exact attention's (left of the dashed line = cheaper)")
        ax.set_ylabel("relative error ‖out − exact‖ / ‖exact‖ (floor 1e-8)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=7, title="marker = T: " + ", ".join(
        f"{_MARKERS[i % len(_MARKERS)]} {T}" for i, T in enumerate(lengths)), title_fontsize=7)
    return fig


def _plot_time_vs_length(result: dict[str, Any]) -> Any:
    from matplotlib.ticker import NullFormatter

    names = list(dict.fromkeys(r["input"] for r in result["records"]))
    fig, axes = _figure(max(1, len(names)))
    for ax, name in zip(axes, names, strict=False):  # no input: one empty panel
        rows = [r for r in result["records"] if r["input"] == name]
        for key in dict.fromkeys((r["method"], r["value"]) for r in rows):
            line = sorted((r["T"], r["time_s"]) for r in rows if (r["method"], r["value"]) == key)
            method, value = key
            ax.plot([t for t, _ in line], [s * 1e3 for _, s in line], marker="o", markersize=3,
                    color=_COLOURS[method], linewidth=2.5 if method == "exact" else 1,
                    label=method if value is None else f"{method} {value}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        lengths = sorted({r["T"] for r in rows})
        ax.set_xticks(lengths, [str(t) for t in lengths])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(name)
        ax.set_xlabel("T (tokens)")
        ax.set_ylabel("time (ms, best of repeats)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=6, ncol=2)
    return fig


def _plot_patterns() -> Any:
    from ..fast.sparse import sliding_window_mask
    from ..report.heatmaps import plot_attention

    fig, axes = _figure(3, width=4.6, height=4.4)
    patterns = [
        ("sliding window W=9, causal", sliding_window_mask(64, 9, is_causal=True)),
        ("sliding window W=9 + global [0]", sliding_window_mask(64, 9, is_causal=False,
                                                                global_tokens=[0])),
        ("BigBird b=4 (3 local, 1 global, 2 random)", block_sparse_mask(64, 4)),
    ]
    for ax, (title, mask) in zip(axes, patterns, strict=True):
        plot_attention(mask.astype(float), ax=ax, title=title, annotate=False)
    return fig


def save_study(result: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """Write approx.json and the PNG plots into ``out_dir``; return the paths.

    - approx.json: the whole result;
    - error_vs_time.png, error_vs_memory.png: error against cost relative to exact
      attention, one panel per input;
    - time_vs_length.png: time against T for every method and knob;
    - patterns.png: the sparse masks, to see what the sparse methods keep.
    """
    from ..report.heatmaps import save_figure

    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    json_path = folder / "approx.json"
    json_path.write_text(json.dumps(_finite(result), indent=2) + "\n", encoding="utf-8")
    written = [json_path]
    figures = [
        ("error_vs_time.png", _plot_error_vs_cost(result, "time_vs_exact", "time")),
        ("error_vs_memory.png", _plot_error_vs_cost(result, "memory_vs_exact", "peak memory")),
        ("time_vs_length.png", _plot_time_vs_length(result)),
        ("patterns.png", _plot_patterns()),
    ]
    for name, fig in figures:
        written.append(save_figure(fig, folder / name))
    return written


def _finite(value: Any) -> Any:
    """JSON has no inf/NaN: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
