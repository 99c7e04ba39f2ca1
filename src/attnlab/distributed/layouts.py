"""How a sequence is cut into W shards, and which tiles of attention each ring step computes.

Three layouts of T positions over W ranks (rank r holds T / W positions, in
increasing order):

- ``"contiguous"``: rank r holds positions r·T/W … (r+1)·T/W − 1 (T % W == 0);
- ``"zigzag"``: the sequence is cut into 2W chunks, rank r holds chunks r and
  2W − 1 − r (T % 2W == 0), so that under a causal mask every rank has the same
  work (PyTorch's head-tail load balancer, ring-flash-attention's zigzag);
- ``"striped"``: rank r holds positions r, r + W, r + 2W, … (T % W == 0)
  (Brandon et al., Striped Attention, 2023).

In a ring step, rank r's queries meet the keys and values of rank ``src``.
:func:`ring_blocks` says which part of that (T/W × T/W) tile the causal mask
leaves, as a few rectangular blocks, each either full or lower-triangular
(``diagonal``: row a may see column b iff b <= a). Everything else is skipped,
never computed. Without ``is_causal`` the block is the whole tile.

Nothing here imports torch: :func:`shard` and :func:`unshard` slice whatever
array they are given (NumPy or torch) along ``dim``.

Dimension legend: B batch, H heads, T sequence length, D head dim, W world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..checks import check_positive_int, describe
from ..errors import AttnlabError, ShapeError
from ..messages import msg

__all__ = [
    "LAYOUTS",
    "Block",
    "Layout",
    "check_layout",
    "check_length",
    "padded_length",
    "positions",
    "ring_blocks",
    "shard",
    "unshard",
]

Layout = Literal["contiguous", "zigzag", "striped"]
LAYOUTS: tuple[Layout, ...] = ("contiguous", "zigzag", "striped")


def check_layout(layout: Any) -> Layout:
    """``layout`` if it is one of :data:`LAYOUTS`, else an AttnlabError naming them."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise AttnlabError(f"layout: expected one of {', '.join(map(repr, LAYOUTS))}, "
                           f"got {describe(layout)}")
    return layout


def _chunks(layout: Layout, world_size: int) -> int:
    """The number of equal chunks the sequence is cut into: 2W for zigzag, W otherwise."""
    return 2 * world_size if layout == "zigzag" else world_size


def padded_length(T: int, *, world_size: int, layout: Layout) -> int:
    """The smallest length >= T that ``layout`` can cut into ``world_size`` equal shards.

    Pad the sequence to it and pass ``key_padding`` False on the padding: the
    padded keys are then never attended to (and the padded queries' outputs are
    thrown away by the caller).
    """
    chunks = _chunks(check_layout(layout), check_positive_int(world_size, "world_size"))
    T = check_positive_int(T, "T", allow_zero=True)
    return -(-T // chunks) * chunks


def check_length(T: int, world_size: int, layout: Layout, name: str = "T") -> int:
    """The shard length T / W, or a ShapeError naming the layout's divisibility rule."""
    chunks = _chunks(layout, world_size)
    if T % chunks:
        raise ShapeError(msg("ring.length", name=name, layout=layout, chunks=chunks, T=T,
                             rule="2W" if layout == "zigzag" else "W",
                             padded=-(-T // chunks) * chunks))
    return T // world_size


def positions(T: int, *, rank: int, world_size: int, layout: Layout) -> np.ndarray:
    """The sequence positions rank ``rank`` holds, in increasing order: int64 (T / W,)."""
    layout = check_layout(layout)
    world_size = check_positive_int(world_size, "world_size")
    rank = check_positive_int(rank, "rank", allow_zero=True)
    if rank >= world_size:
        raise AttnlabError(f"rank: expected 0 <= rank < world_size = {world_size}, got {rank}")
    n = check_length(T, world_size, layout)
    if layout == "contiguous":
        return np.arange(rank * n, (rank + 1) * n)
    if layout == "striped":
        return np.arange(rank, T, world_size)
    c = n // 2  # zigzag: chunks r and 2W - 1 - r, each T / 2W long
    tail = 2 * world_size - 1 - rank
    return np.concatenate([np.arange(rank * c, (rank + 1) * c),
                           np.arange(tail * c, (tail + 1) * c)])


def _dim(ndim: int, dim: int, name: str) -> int:
    if not -ndim <= dim < ndim:
        raise ShapeError(f"dim: expected an axis of {name} (ndim {ndim}), got {dim}")
    return dim % ndim


def _take(x: Any, index: np.ndarray, dim: int) -> Any:
    """x's entries at ``index`` along ``dim``, for NumPy arrays and torch tensors alike."""
    if isinstance(x, np.ndarray):
        return np.take(x, index, axis=dim)
    import torch  # a tensor was passed, so torch is there

    return torch.index_select(x, dim, torch.as_tensor(index, device=x.device))


def shard(x: Any, *, rank: int, world_size: int, layout: Layout, dim: int = -2) -> Any:
    """Rank ``rank``'s shard of a full sequence: its positions along ``dim``, in order.

    Shapes: x (..., T, ...) with T along ``dim`` -> (..., T / W, ...). A NumPy
    array gives a NumPy array, a torch tensor a torch tensor (a copy; autograd
    flows through it). T must be a multiple of W (2W for zigzag): see
    :func:`padded_length`.

    >>> x = np.arange(8)[:, None]  # (T, 1)
    >>> shard(x, rank=1, world_size=2, layout="zigzag")[:, 0].tolist()
    [2, 3, 4, 5]
    >>> shard(x, rank=1, world_size=2, layout="striped")[:, 0].tolist()
    [1, 3, 5, 7]
    """
    ndim = getattr(x, "ndim", None)
    if ndim is None:
        raise AttnlabError(f"x: expected a NumPy array or a torch tensor, got {describe(x)}")
    axis = _dim(ndim, dim, "x")
    index = positions(int(x.shape[axis]), rank=rank, world_size=world_size, layout=layout)
    return _take(x, index, axis)


def unshard(parts: Sequence[Any], *, layout: Layout, dim: int = -2) -> Any:
    """The full sequence from every rank's shard (``parts[r]`` from rank r): undoes :func:`shard`.

    Shapes: W parts of (..., T / W, ...) -> (..., T, ...), NumPy or torch as given.

    >>> x = np.arange(12).reshape(6, 2)  # (T, 2)
    >>> parts = [shard(x, rank=r, world_size=3, layout="striped") for r in range(3)]
    >>> bool((unshard(parts, layout="striped") == x).all())
    True
    """
    layout = check_layout(layout)
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or not parts:
        raise AttnlabError(f"parts: expected a non-empty list of shards, one per rank, "
                           f"got {describe(parts)}")
    W = len(parts)
    first = parts[0]
    for r, part in enumerate(parts):  # one kind for all: np.concatenate / torch.cat need it
        if not hasattr(part, "shape") or (isinstance(part, np.ndarray)
                                          != isinstance(first, np.ndarray)):
            raise AttnlabError(msg("ring.unshard_kind", index=r, kind=type(first).__name__,
                                   got=describe(part)))
    axis = _dim(first.ndim, dim, "parts[0]")
    for r, part in enumerate(parts):
        if tuple(part.shape) != tuple(first.shape):
            raise ShapeError(f"parts[{r}]: expected the shape of parts[0] "
                             f"{tuple(first.shape)}, got {tuple(part.shape)}")
    T = int(first.shape[axis]) * W
    order = np.concatenate([positions(T, rank=r, world_size=W, layout=layout)
                            for r in range(W)])  # (T,) position of each concatenated row
    inverse = np.argsort(order)  # (T,) row of each position
    if isinstance(first, np.ndarray):
        return np.take(np.concatenate(list(parts), axis=axis), inverse, axis=axis)
    import torch

    return _take(torch.cat(list(parts), dim=axis), inverse, axis)


@dataclass(frozen=True)
class Block:
    """A rectangle of one ring step's (T/W × T/W) tile that is computed.

    ``rows`` are local query rows, ``cols`` local key rows of the visiting shard;
    ``diagonal``: row a of the block may see column b iff b <= a (the block is
    square); otherwise every entry is computed.
    """

    rows: slice
    cols: slice
    diagonal: bool

    def pairs(self) -> int:
        """How many (query, key) scores the block computes."""
        n_rows = self.rows.stop - self.rows.start
        n_cols = self.cols.stop - self.cols.start
        return n_rows * (n_rows + 1) // 2 if self.diagonal else n_rows * n_cols


def ring_blocks(
    rank: int, src: int, n: int, *, world_size: int, layout: Layout, is_causal: bool
) -> list[Block]:
    """The blocks rank ``rank`` computes against the shard of rank ``src`` (n = T / W each).

    Without ``is_causal``: the whole tile. With it (query at position p sees
    keys at positions <= p):

    - contiguous: src < rank the whole tile; src == rank lower-triangular;
      src > rank nothing (which is why the last rank works ~2W times the first);
    - zigzag (chunks r and 2W−1−r, c = n / 2 each): src == rank lower-triangular
      over the shard; src < rank every query against the visitor's first chunk;
      src > rank the second query chunk against the whole visitor: half a tile;
    - striped (positions r + W·i): src <= rank lower-triangular (key j <= query i);
      src > rank strictly lower (j < i): rows 1.., columns ..n−1.
    """
    whole = slice(0, n)
    if not is_causal:
        return [Block(whole, whole, False)]
    if layout == "contiguous":
        if src < rank:
            return [Block(whole, whole, False)]
        return [Block(whole, whole, True)] if src == rank else []
    if layout == "zigzag":
        c = n // 2
        if src == rank:
            return [Block(whole, whole, True)]
        if src < rank:
            return [Block(whole, slice(0, c), False)]
        return [Block(slice(c, n), whole, False)]
    if src <= rank:  # striped
        return [Block(whole, whole, True)]
    return [Block(slice(1, n), slice(0, n - 1), True)] if n > 1 else []
