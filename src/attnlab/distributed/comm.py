"""The communication of the torch functions: the group, checks that every rank agrees, sends.

Bad input must fail on *every* rank, with the same clear message, and never
leave the others waiting in a collective for a rank that raised. So the public
functions check their inputs locally, then exchange a small summary (shapes,
dtypes, options and the local error, if any) with one ``all_gather_object``,
and every rank raises if any rank's inputs are wrong or differ from the others'.

Dimension legend: W world size (ranks in the group).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ..checks import check_flag, check_scale, describe
from ..errors import AttnlabError
from .layouts import Layout, check_layout

__all__ = ["CommStats", "DistributedError", "agree", "check_group", "exchange", "ring_peers",
           "shard_problem"]


class DistributedError(AttnlabError):
    """The process group is missing, or the ranks were given inputs that do not fit together."""


@dataclass
class CommStats:
    """Counts of one rank's point-to-point exchanges, filled in when passed as ``stats=``.

    An exchange is one step's send of a shard to the next rank and receive from
    the previous one (one ``batch_isend_irecv``); the counts add up over calls.
    """

    forward_kv: int = 0  # K/V shards sent in the forward
    backward_kv: int = 0  # K/V shards sent again in the backward
    backward_grad: int = 0  # dK/dV shards sent in the backward (they travel back home)
    all_to_all: int = 0  # Ulysses' all-to-all calls (forward and backward)
    bytes_sent: int = 0
    # Per forward ring step: seconds computing its blocks, then seconds waiting for the
    # exchange to finish (what the overlap did not hide).
    step_compute_s: list[float] = field(default_factory=list)
    step_wait_s: list[float] = field(default_factory=list)


def check_group(group: Any) -> tuple[int, int]:
    """(rank, world size) of this process in ``group`` (None: the default group).

    Raises :class:`DistributedError` if torch.distributed is not initialised:
    a purely local check, so it fails on every rank alike without waiting.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedError(
            "group: torch.distributed is not initialised; call "
            "torch.distributed.init_process_group(...) on every rank first "
            "(attnlab.distributed.spawn does it for local gloo processes)"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise DistributedError(f"group: expected a torch.distributed ProcessGroup or None, "
                               f"got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise DistributedError("group: this process is not a member of the group")
    return rank, dist.get_world_size(group)


def agree(summary: dict[str, Any], error: str | None, rank: int, world_size: int,
          group: Any, what: str) -> list[dict[str, Any]]:
    """Every rank's ``summary``; raises the same DistributedError on every rank if any rank
    had a local ``error`` or a summary different from rank 0's.

    ``summary``: plain values (shapes as tuples, dtypes as strings, flags) that
    must be equal across ranks.
    """
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, (error, summary), group=group)
    for other, (other_error, _) in enumerate(everyone):
        if other_error is not None:
            prefix = "" if other == rank else f"rank {other} of {world_size}: "
            raise DistributedError(f"{prefix}{other_error}")
    first = everyone[0][1]
    for other, (_, other_summary) in enumerate(everyone):
        for key, value in other_summary.items():
            if first.get(key) != value:
                raise DistributedError(
                    f"{what}: every rank must pass shards of the same shape and the same "
                    f"options; {key} is {first.get(key)} on rank 0 but {value} on rank {other}"
                )
    return [s for _, s in everyone]


def ring_peers(rank: int, world_size: int, group: Any) -> tuple[int, int]:
    """The global ranks of the next (rank + 1) and previous (rank − 1) ranks in ``group``."""
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    if group is None:
        return nxt, prev
    return dist.get_global_rank(group, nxt), dist.get_global_rank(group, prev)


def exchange(tensors: Sequence[torch.Tensor], peers: tuple[int, int], group: Any,
             ) -> tuple[list[torch.Tensor], list[Any]]:
    """Start sending ``tensors`` to the next rank and receiving as many from the previous.

    Returns the receive buffers and the requests; wait on every request before
    reading the buffers or changing the tensors sent. One ``batch_isend_irecv``,
    so the sends and receives of all ranks are posted together (no ordering
    deadlock) and run while the caller computes.
    """
    nxt, prev = peers
    received = [torch.empty_like(t) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, buf, prev, group) for buf in received]
    return received, dist.batch_isend_irecv(ops)


def wait_all(requests: Sequence[Any]) -> None:
    for request in requests:
        request.wait()


@dataclass(frozen=True)
class AgreedCall:
    """A call's options once every rank has checked them and found them equal."""

    rank: int
    world_size: int
    layout: Layout
    is_causal: bool
    scale: float
    flags: dict[str, bool]


def agree_on_call(q: Any, k: Any, v: Any, key_padding: Any, *, layout: Any, is_causal: Any,
                  scale: Any, group: Any, flags: Mapping[str, Any] | None = None) -> AgreedCall:
    """Check this rank's shards and options, then compare them with every other rank's
    (:func:`agree`): the preamble of every sharded attention function. ``flags``: more
    boolean options by name, checked alike and returned in ``AgreedCall.flags``."""
    rank, world_size = check_group(group)
    problem: str | None = None
    checked: dict[str, bool] = {}
    scale_value = 1.0
    try:
        layout = check_layout(layout)
        is_causal = check_flag(is_causal, "is_causal")
        checked = {name: check_flag(value, name) for name, value in (flags or {}).items()}
        problem = shard_problem(q, k, v, key_padding)
        scale_value = check_scale(scale, int(q.shape[-1])) if problem is None else 1.0
    except AttnlabError as exc:
        problem = str(exc)
    summary = {} if problem is not None else {
        "q shape": tuple(q.shape), "k shape": tuple(k.shape), "v shape": tuple(v.shape),
        "dtype": str(q.dtype), "key_padding": key_padding is not None, "layout": layout,
        "is_causal": is_causal, "scale": scale_value, **checked,
        # a rank that will run the backward waits there for its peers: all or none
        "requires_grad": torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
    }
    agree(summary, problem, rank, world_size, group, "q, k, v")
    return AgreedCall(rank, world_size, layout, is_causal, scale_value, checked)


def shard_problem(q: Any, k: Any, v: Any, key_padding: Any) -> str | None:
    """What is wrong with this rank's shards, in one line, or None."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return f"{name}: expected a float tensor, got {describe(x)}"
        if x.ndim != 4:
            return f"{name}: expected a 4-d shard (B, heads, n, dim), got shape {tuple(x.shape)}"
    if q.dtype != k.dtype or q.dtype != v.dtype:
        return f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    if len({q.device, k.device, v.device}) > 1:
        return f"q, k, v: expected one device, got {q.device}, {k.device}, {v.device}"
    B, H, n, D = q.shape
    Hkv = k.shape[1]
    if tuple(k.shape) != (B, Hkv, n, D) or tuple(v.shape[:3]) != (B, Hkv, n):
        return (f"k, v: expected (B, Hkv, n, D) = ({B}, Hkv, {n}, {D}) and (B, Hkv, n, Dv) "
                f"matching q (B, H, n, D) = {tuple(q.shape)}, got {tuple(k.shape)}, "
                f"{tuple(v.shape)}")
    if Hkv == 0 or H % Hkv:
        return f"k: expected key/value heads Hkv dividing the query heads H = {H}, got {Hkv}"
    if key_padding is not None and (
        not isinstance(key_padding, torch.Tensor) or key_padding.dtype != torch.bool
        or tuple(key_padding.shape) != (B, n)
    ):
        return (f"key_padding: expected a bool tensor (B, n) = ({B}, {n}) (True = a real "
                f"token), got {describe(key_padding)}")
    return None
