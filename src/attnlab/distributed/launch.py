"""Run a function on W local processes joined in a gloo group: for tests, the CLI, benchmarks.

Each process initialises torch.distributed from a file in a fresh temporary
folder (``file://``: no network ports), sets torch to ``threads`` threads,
calls ``fn(rank, world_size, *args)`` and pickles what it returns. The parent
waits with an overall deadline: a worker that hangs (a collective some rank
never joined) is killed and reported, instead of stalling the caller.

Dimension legend: W world size.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..checks import check_positive_int
from .comm import DistributedError

__all__ = ["spawn"]


def _worker(rank: int, fn: Callable[..., Any], world_size: int, folder: str, backend: str,
            threads: int, args: Sequence[Any]) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method=f"file://{folder}/rendezvous", rank=rank,
                            world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        with open(os.path.join(folder, f"result-{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
          timeout: float = 120.0, backend: str = "gloo", threads: int = 1) -> list[Any]:
    """``[fn(rank, world_size, *args) for rank in range(world_size)]``, each in its own process.

    ``fn`` must be importable by the child processes (a module-level function)
    and return something picklable. An exception in a worker is raised here
    (torch's ProcessRaisedException, with the worker's traceback); the others
    are stopped. Past ``timeout`` seconds, all are killed and a
    :class:`~attnlab.distributed.comm.DistributedError` says which had not finished.
    """
    world_size = check_positive_int(world_size, "world_size")
    threads = check_positive_int(threads, "threads")
    with tempfile.TemporaryDirectory(prefix="attnlab-ring-") as folder:
        context = mp.spawn(_worker, args=(fn, world_size, folder, backend, threads, tuple(args)),
                           nprocs=world_size, join=False)
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    alive = [r for r, p in enumerate(context.processes) if p.is_alive()]
                    raise DistributedError(
                        f"spawn: ranks {alive} of {world_size} had not finished after "
                        f"{timeout:g} s (a collective that some rank never joined?); "
                        f"all were stopped")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        results = []
        for rank in range(world_size):
            with open(Path(folder) / f"result-{rank}.pkl", "rb") as f:
                results.append(pickle.load(f))  # written by our own workers just now
        return results
