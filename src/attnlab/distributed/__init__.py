"""attnlab.distributed — attention over a sequence split across ranks (context parallelism).

=========================================  ==================================================
``simulate(q, k, v, *, world_size, ...)``  a virtual ring in NumPy, every step recorded
``ring_attention(q, k, v, *, ...)``        ring attention on torch.distributed (gloo, NCCL)
``ulysses_attention(q, k, v, *, ...)``     all-to-all from sequence to head shards and back
``shard`` / ``unshard``                    a full sequence to one rank's shard and back
``positions``, ``padded_length``           which positions a rank holds; the length to pad to
``spawn``                                  run a function on W local gloo processes
``DistributedError``, ``CommStats``        bad or mismatched input; exchange counts
=========================================  ==================================================

Layouts (:mod:`~attnlab.distributed.layouts`): ``"contiguous"`` (rank r holds
positions r·T/W …), ``"zigzag"`` (chunks r and 2W−1−r of 2W), ``"striped"``
(positions r, r+W, …). The NumPy parts import no torch; the torch functions are
imported on first use, so ``from attnlab.distributed import simulate`` works
where torch is not installed.

Dimension legend: B batch, H heads, Hkv key/value heads, T sequence length,
D head dim, Dv value dim, W world size. Mask convention: ``key_padding`` is bool
(B, T), **True = a real token**.
"""

from __future__ import annotations

from typing import Any

from .layouts import LAYOUTS, Block, padded_length, positions, ring_blocks, shard, unshard
from .simulate import RingReport, Simulation, StepRecord, simulate

__all__ = [
    "LAYOUTS",
    "Block",
    "CommStats",
    "DistributedError",
    "RingReport",
    "Simulation",
    "StepRecord",
    "padded_length",
    "positions",
    "ring_attention",
    "ring_blocks",
    "shard",
    "simulate",
    "spawn",
    "ulysses_attention",
    "unshard",
]

_TORCH_NAMES = {"ring_attention": "ring", "ulysses_attention": "ulysses", "spawn": "launch",
                "CommStats": "comm", "DistributedError": "comm"}


def __getattr__(name: str) -> Any:
    """The torch functions, imported when first asked for."""
    if name in _TORCH_NAMES:
        import importlib

        module = importlib.import_module(f"{__name__}.{_TORCH_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
