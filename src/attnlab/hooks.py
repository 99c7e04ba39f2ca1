"""Named hook points inside ``forward``: one mechanism to read and edit intermediates,
for the NumPy and the torch blocks alike (framework-free: it never imports torch).

A block calls ``value = hook_point(self, "hook_q", value)`` at each named point of
its ``forward``. With nothing attached that is one attribute read (``self.hook_site``
is None) and the value passes through unchanged; :func:`attached` puts a
:class:`HookSite` on every module of a model for the duration of a ``with`` block,
and the site calls the functions attached to that point.

Names (TransformerLens's, layers 0-based). A module lists its points in forward
order with :meth:`hook_points`, entries being a local name (``"hook_q"``) or a
``(child_name, child)`` pair whose own points are named under ``child_name.``; the
full name of a point is the path from the model, e.g. ``blocks.3.attn.hook_pattern``.
:func:`hook_names` lists them all. The names attnlab's blocks expose, with their
shapes (B batch, H heads, Hkv key/value heads, T query length, S key length,
D head dim, Dv value head dim, E model width, F feed-forward width)::

    hook_embed, hook_pos_embed              (B, T, E)   token / position embeddings
    blocks.{l}.hook_resid_pre               (B, T, E)   the block's input
    blocks.{l}.ln1.hook_normalized          (B, T, E)   LayerNorm 1's output
    blocks.{l}.attn.hook_q                  (B, H, T, D)
    blocks.{l}.attn.hook_k, hook_v          (B, Hkv, S, D), (B, Hkv, S, Dv)
    blocks.{l}.attn.hook_rot_q, hook_rot_k  after RoPE (only where there is RoPE)
    blocks.{l}.attn.hook_attn_scores        (B, H, T, S) scaled, soft-capped, biased,
                                            not-allowed positions at -inf, pre-softmax
    blocks.{l}.attn.hook_pattern            (B, H, T, S) softmax of the scores
    blocks.{l}.attn.hook_z                  (B, H, T, Dv) each head's output before Wo
    blocks.{l}.attn.hook_result             (B, H, T, E) each head's share after Wo
                                            (opt-in: H times the memory of the output)
    blocks.{l}.hook_attn_out                (B, T, E)   attention output after Wo
    blocks.{l}.hook_resid_mid               (B, T, E)   what the MLP sublayer adds to
    blocks.{l}.ln2.hook_normalized          (B, T, E)
    blocks.{l}.mlp.hook_pre, hook_post      (B, T, F)   before / after the activation
    blocks.{l}.hook_mlp_out                 (B, T, E)
    blocks.{l}.hook_resid_post              (B, T, E)   the block's output
    ln_final.hook_normalized                (B, T, E)   where there is a final LayerNorm

docs/hooks.md has the table per model (which names exist in post-LN and pre-LN
blocks, and in the decoders).

Hook functions: ``fn(value, name)`` returns None to read (``value`` must not be
modified in place) or an array/tensor of the same shape to replace ``value`` (an
edit): the forward continues from the replacement. Several functions on one point
run in the order attached, each seeing the previous one's result.

:func:`attached` is the one way to attach them::

    with attached(model, [("blocks.0.attn.hook_z", zero_head_3),
                          (lambda name: name.endswith("hook_pattern"), keep)]):
        out = model(x)

An entry's first element is a full name (checked: an unknown name is an error
listing the names), or a predicate ``name -> bool`` over :func:`hook_names`.
Hooks are removed when the block ends, normally or by an exception; blocks nest
(an inner block's functions run after the outer one's, and leaving it restores the
outer set exactly). Nothing else is changed: weights, module lists and the fast
paths' choices are the model's own.

Opt-in points (:data:`OPT_IN`: ``hook_result``) are computed only when a function
is attached to them; :func:`select_names` leaves them out of ``names=None``.
With any hook attached to ``hook_attn_scores`` or ``hook_pattern`` of an attention
module, that module computes its scores explicitly (the plain path) instead of
through a fused kernel; other points keep the fast paths.

Caching is :func:`cache_into`: a read that stores a copy (NumPy) or a ``detach()``
(torch; pass ``keep_grad=True`` to keep the autograd graph) under the point's name.
Gradients flow through edits on torch: the replacement is used as is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from .checks import shape_str
from .errors import AttnlabError

__all__ = ["HookFn", "HookSite", "Hookable", "NameFilter", "OPT_IN", "any_attached", "attached",
           "cache_into",
           "hook_names", "hook_point", "hook_tree", "is_hooked", "select_names"]

#: ``fn(value, name) -> replacement or None``.
HookFn = Callable[[Any, str], Any]
#: None (every name but the opt-in ones), a list of names, or a predicate ``name -> bool``.
NameFilter = Sequence[str] | Callable[[str], bool] | None

#: Local names computed only when a function is attached to them (they cost memory).
OPT_IN = ("hook_result",)


class Hookable(Protocol):
    """A module with hook points: ``hook_points()`` in forward order, ``hook_site``
    (None, or the :class:`HookSite` that :func:`attached` put there)."""

    def hook_points(self) -> list[str | tuple[str, Any]]: ...


class HookSite:
    """The hooks of one module while attached: local name -> (fn, full name) pairs, in
    the order attached.

    ``site(local, value)`` runs them on ``value`` and returns what the forward
    continues from. Each function is called with the name it was attached under (an
    inner attachment rooted at a submodule names its points from there). ``prefix`` is
    the module's full name with a trailing dot in the latest attachment ("" for its root).
    """

    __slots__ = ("fns", "prefix")

    def __init__(self, fns: dict[str, tuple[tuple[HookFn, str], ...]], prefix: str = ""):
        self.fns, self.prefix = fns, prefix

    def wants(self, local: str) -> bool:
        """Whether a function is attached to the point ``local`` of this module."""
        return local in self.fns

    def __call__(self, local: str, value: Any) -> Any:
        fns = self.fns.get(local)
        if not fns:
            return value
        for fn, name in fns:
            replaced = fn(value, name)
            if replaced is not None:
                if getattr(replaced, "shape", None) != getattr(value, "shape", None):
                    got = (shape_str(replaced.shape) if hasattr(replaced, "shape")
                           else type(replaced).__name__)
                    raise AttnlabError(
                        f"hook {name}: expected None or a replacement of shape "
                        f"{shape_str(value.shape)}, got {got}"
                    )
                value = replaced
        return value


def hook_point(module: Any, local: str, value: Any) -> Any:
    """The value a forward continues from at ``module``'s point ``local``: ``value``
    itself unless hooks are attached there. The one call a block makes per point."""
    site = module.hook_site
    return value if site is None else site(local, value)


def is_hooked(module: Any, *locals_: str) -> bool:
    """Whether any of the points ``locals_`` of ``module`` has a function attached
    (a block asks this before computing something only a hook needs)."""
    site = module.hook_site
    return site is not None and any(site.wants(local) for local in locals_)


def hook_tree(model: Any) -> Iterator[tuple[str, Any, list[str]]]:
    """(prefix, module, its local names) for ``model`` and every module under it that
    has hook points, depth first in forward order; prefix "" for the model."""
    _check_hookable(model)

    def walk(prefix: str, module: Any) -> Iterator[tuple[str, Any, list[str]]]:
        locals_: list[str] = []
        children: list[tuple[str, Any]] = []
        for entry in module.hook_points():
            if isinstance(entry, str):
                locals_.append(entry)
            else:
                children.append(entry)
        yield prefix, module, locals_
        for child_name, child in children:
            yield from walk(f"{prefix}{child_name}.", child)

    yield from walk("", model)


def any_attached(model: Any) -> bool:
    """Whether a function is attached anywhere in ``model`` (a fast path that has no
    hook points asks this, and leaves the work to the plain path when it is True)."""
    return any(module.hook_site is not None for _, module, _ in hook_tree(model))


def hook_names(model: Any) -> list[str]:
    """Every hook point's full name in ``model``, in forward order (opt-in ones too)."""
    _check_hookable(model)
    names: list[str] = []

    def walk(prefix: str, module: Any) -> None:
        for entry in module.hook_points():
            if isinstance(entry, str):
                names.append(prefix + entry)
            else:
                walk(f"{prefix}{entry[0]}.", entry[1])

    walk("", model)
    return names


def select_names(all_names: Sequence[str], names: NameFilter, what: str = "names") -> list[str]:
    """The names a filter chooses, in ``all_names``' order.

    None: all but the opt-in points (:data:`OPT_IN`); a list: those names (each must
    exist); a predicate ``name -> bool``: those it accepts (opt-in ones included).
    """
    if names is None:
        return [n for n in all_names if n.rsplit(".", 1)[-1] not in OPT_IN]
    if callable(names):
        return [n for n in all_names if names(n)]
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise AttnlabError(
            f"{what}: expected None, a list of hook names or a predicate name -> bool, "
            f"got {type(names).__name__}"
        )
    chosen = list(names)
    known = set(all_names)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise AttnlabError(
            f"{what}: expected hook names of this model ({_sample(all_names)}), "
            f"got unknown {unknown[:5]}"
        )
    return [n for n in all_names if n in set(chosen)]


@contextmanager
def attached(model: Any, hooks: Sequence[tuple[str | Callable[[str], bool], HookFn]]
             ) -> Iterator[Any]:
    """Attach ``hooks`` (``[(name_or_predicate, fn), ...]``) to ``model``'s hook points
    for the ``with`` block; yields the model. See the module docstring."""
    if isinstance(hooks, tuple) and len(hooks) == 2 and callable(hooks[1]):
        hooks = [hooks]  # type: ignore[list-item]  # a single (name, fn) pair
    tree = list(hook_tree(model))
    all_names = [prefix + local for prefix, _, locals_ in tree for local in locals_]
    added: dict[str, list[HookFn]] = {}
    for i, entry in enumerate(hooks):
        if not (isinstance(entry, tuple) and len(entry) == 2 and callable(entry[1])):
            raise AttnlabError(
                f"hooks[{i}]: expected a (name or predicate, fn) pair with fn(value, name), "
                f"got {entry!r:.80}"
            )
        target, fn = entry
        if isinstance(target, str):
            chosen = select_names(all_names, [target], f"hooks[{i}]")
        elif callable(target):
            chosen = select_names(all_names, target)
        else:
            raise AttnlabError(
                f"hooks[{i}]: expected a hook name or a predicate name -> bool, "
                f"got {type(target).__name__}"
            )
        for name in chosen:
            added.setdefault(name, []).append(fn)
    seen: dict[int, str] = {}
    saved: list[tuple[Any, HookSite | None]] = []
    try:
        for prefix, module, locals_ in tree:
            if id(module) in seen:
                raise AttnlabError(
                    f"model: the same module sits at {seen[id(module)] or 'the top'} and at "
                    f"{prefix or 'the top'}; hook points need one name per module"
                )
            seen[id(module)] = prefix
            outer: HookSite | None = module.hook_site
            fns = dict(outer.fns) if outer is not None else {}
            for local in locals_:
                extra = added.get(prefix + local)
                if extra:
                    fns[local] = fns.get(local, ()) + tuple((fn, prefix + local) for fn in extra)
            saved.append((module, outer))
            module.hook_site = HookSite(fns, prefix) if fns else None
        yield model
    finally:
        for module, outer in reversed(saved):
            module.hook_site = outer


def cache_into(cache: dict[str, Any], *, keep_grad: bool = False) -> HookFn:
    """A read that stores each value it sees under its name: a NumPy copy, or a torch
    tensor detached from the graph (unless ``keep_grad``). Values seen twice under one
    name (a model called twice) are stacked in a list, in call order."""

    def keep(value: Any, name: str) -> None:
        if hasattr(value, "detach"):
            stored = value if keep_grad else value.detach()
        else:
            stored = value.copy() if hasattr(value, "copy") else value
        if name in cache:
            before = cache[name]
            cache[name] = (before if isinstance(before, list) else [before]) + [stored]
        else:
            cache[name] = stored
        return None

    return keep


def _check_hookable(model: Any) -> None:
    if not callable(getattr(model, "hook_points", None)):
        raise AttnlabError(
            f"model: expected a module with named hook points (attnlab's blocks and models "
            f"have them), got {type(model).__name__}"
        )


def _sample(names: Sequence[str]) -> str:
    shown = ", ".join(list(names)[:6])
    return f"{shown}, ... ({len(names)} in all; see hook_names(model))" if len(names) > 6 \
        else shown
