"""The measuring tools every study uses: thread limits, an interleaved timer, peak memory,
and the environment the numbers were measured in.

Method, the same for ``attnlab bench``, ``attnlab approx`` and ``attnlab profile``:

- **Threads.** :func:`limit_threads` sets NumPy's BLAS and OpenMP pools (threadpoolctl)
  and, if asked, torch's intra-op pool, and restores what it changed on exit, also
  after an error, so every contender runs on the same cores.
- **Time.** :func:`interleaved` times several calls in rounds: each round times every
  call once, in an order rotated every round, so drift in machine load hits them
  alike. A call shorter than ``min_time`` is repeated until a sample lasts that long
  (the sample is the mean per call). The result is a :class:`Timing` per call: the
  median of the samples, with their spread.
- **Memory.** :func:`peak_traced_bytes` / :func:`traced_peak`: the peak that
  ``tracemalloc`` sees (NumPy reports its buffers to it; torch does not) above what
  was allocated before. :func:`peak_rss_bytes`: the growth of the process's resident
  set (Linux ``VmHWM`` reset through ``/proc/self/clear_refs``, after ``malloc_trim``
  returned freed heap pages), page granular, counting everything the process touched;
  None where ``/proc`` is missing.

Figures come from :func:`attnlab.report.figures.new_figure`, the library's one figure
factory. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import numpy as np

from ..checks import check_positive_int
from ..errors import missing_extra

__all__ = [
    "Timing",
    "attnlab_version",
    "blas_threads",
    "calls_per_sample",
    "environment",
    "interleaved",
    "limit_threads",
    "peak_rss_bytes",
    "peak_traced_bytes",
    "time_call",
    "traced_peak",
]

#: At most this many calls make one sample (``min_time / one call`` may be huge, or inf).
MAX_CALLS_PER_SAMPLE = 10_000


# --------------------------------------------------------------------------- threads


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


@contextlib.contextmanager
def limit_threads(threads: int | None, *, torch: bool = False,
                  feature: str = "Limiting threads") -> Iterator[None]:
    """Run NumPy's BLAS and OpenMP pools, and with ``torch=True`` torch's intra-op pool
    (if torch is installed), with ``threads`` threads inside the block.

    Everything changed is restored on exit, also after an error. ``threads=None``
    changes nothing. threadpoolctl is needed (the ``bench`` extra): without it an
    ImportError names ``feature``.
    """
    if threads is None:
        yield
        return
    threads = check_positive_int(threads, "threads")
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        raise missing_extra("threadpoolctl", "bench", feature) from None
    torch_module = _torch() if torch else None
    before = torch_module.get_num_threads() if torch_module is not None else None
    with threadpool_limits(limits=threads):
        if torch_module is not None:
            torch_module.set_num_threads(threads)
        try:
            yield
        finally:
            if torch_module is not None and before is not None:
                torch_module.set_num_threads(before)


def blas_threads() -> list[int]:
    """The thread count of every BLAS library loaded in this process (threadpoolctl)."""
    from threadpoolctl import threadpool_info

    return [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"]


# ------------------------------------------------------------------------------ time


@dataclass
class Timing:
    """Seconds per call, one sample per round; the median and spread of the samples."""

    samples: list[float]
    calls_per_sample: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def to_dict(self) -> dict[str, Any]:
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max,
                "samples_s": list(self.samples), "calls_per_sample": self.calls_per_sample}


def time_call(fn: Callable[[], Any], number: int = 1, *,
              clock: Callable[[], float] = time.perf_counter) -> float:
    """Mean time of ``number`` calls of ``fn``, in seconds: wall time by default
    (``time.perf_counter``); ``clock=time.process_time`` gives the process's CPU time
    (all its threads), the steadier figure of one thread's work on a shared machine."""
    start = clock()
    for _ in range(number):
        fn()
    return (clock() - start) / number


def calls_per_sample(fn: Callable[[], Any], min_time: float) -> int:
    """How many calls of ``fn`` (already warm) make a sample of at least ``min_time`` s.

    ``min_time <= 0`` gives 1 without calling ``fn`` (stateful calls, such as a decoding
    step that appends to a cache, must run exactly once per sample).
    """
    if min_time <= 0:
        return 1
    one = time_call(fn, 1)
    if one >= min_time or one <= 0:
        return 1
    return math.ceil(min(float(MAX_CALLS_PER_SAMPLE), min_time / one))


def interleaved(
    calls: Mapping[str, Callable[[], Any]],
    repeats: int,
    *,
    min_time: float = 0.0,
    after_round: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Time every call ``repeats`` times, interleaved; name -> :class:`Timing` (median).

    Round r times each call once (one sample: ``calls_per_sample`` calls, their mean), in
    the order of ``calls`` rotated by r, then calls ``after_round(r)``. The calls
    should be warm (run once before); they are timed in the caller's thread settings,
    by ``clock`` (wall time unless told; see :func:`time_call`).
    """
    repeats = check_positive_int(repeats, "repeats")
    names = list(calls)
    numbers = {name: calls_per_sample(calls[name], min_time) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            samples[name].append(time_call(calls[name], numbers[name], clock=clock))
        if after_round is not None:
            after_round(round_index)
    return {name: Timing(samples[name], numbers[name]) for name in names}


# ---------------------------------------------------------------------------- memory


@contextlib.contextmanager
def traced_peak() -> Iterator[dict[str, int]]:
    """Peak bytes allocated inside the block, above what was live at its start.

    Yields a dict whose ``"peak"`` is set on exit. Starts tracemalloc if it was off and
    stops it again; if it was already on, only its peak is reset.
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


def peak_traced_bytes(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated during ``fn()`` as seen by tracemalloc (NumPy reports its
    buffers to it; torch does not), beyond what was allocated before the call. The
    result of ``fn`` is held until the peak is read, so the output counts."""
    with traced_peak() as traced:
        result = fn()
        del result
    return traced["peak"]


def _proc_status(field_name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"{field_name} not in /proc/self/status")


def _malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc), so that reusing them shows in the RSS."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


def peak_rss_bytes(fn: Callable[[], Any]) -> int | None:
    """Growth of the resident set during ``fn()``: VmHWM after minus VmRSS before.

    The high-water mark is reset first (``/proc/self/clear_refs`` = 5) after
    ``malloc_trim``. Page granular; counts everything the process touched.
    None where Linux's /proc interface is not available.
    """
    _malloc_trim()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        before = _proc_status("VmRSS")
    except OSError:
        return None
    result = fn()
    peak = _proc_status("VmHWM")
    del result
    return max(0, peak - before)


# ----------------------------------------------------------------------- environment


def attnlab_version() -> str:
    """The installed attnlab's version (package metadata), or "unknown" from a bare checkout."""
    try:
        return metadata.version("attnlab")
    except metadata.PackageNotFoundError:
        return "unknown"


def environment(threads: int | None) -> dict[str, Any]:
    """Versions, CPU and thread settings the numbers were measured with."""
    env: dict[str, Any] = {
        "attnlab": attnlab_version(), "python": platform.python_version(),
        "numpy": np.__version__, "platform": platform.platform(),
        "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "threads": threads,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    torch_module = _torch()
    env["torch"] = None if torch_module is None else torch_module.__version__
    try:
        from threadpoolctl import threadpool_info

        env["blas"] = [
            {k: info.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for info in threadpool_info() if info.get("user_api") == "blas"
        ]
    except ImportError:
        env["blas"] = None
    return env
