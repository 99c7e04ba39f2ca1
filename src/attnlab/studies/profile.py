"""Where the time goes: a BERT encoder's real blocks, timed module by module, beside the
FLOPs of each part (:mod:`attnlab.studies.flops`).

Seed 001 says self-attention is "about 60%" of BERT-base's compute. Whether that is
true depends on what counts as "self-attention" (with or without the Q/K/V/output
projections) and on the sequence length T: :mod:`~attnlab.studies.flops` makes both
explicit; this module measures what the blocks really spend.

Timing
------
:func:`profiled_forward` runs the model's own ``forward`` on its own blocks, with
timing hooks around their modules: each block is a shallow copy whose ``attn``,
``ffn``, ``norm1`` and ``norm2`` are the same objects behind a wrapper that takes a
``time.perf_counter`` lap before and after each call. Nothing is re-implemented, so
whatever the blocks do (RoPE, ALiBi, grouped-query heads, the one attention kernel,
the input checks at each module's boundary) is what is timed. The parts::

    embeddings    BertModel.embed, with forward's input checks                [rest]
    attention     the block's MultiHeadAttention call: Q/K/V projections,
                  positions, QKᵀ, softmax, ·V, output projection               [attention]
    feed_forward  the block's FeedForward call: X·W1 + b1, activation, ·W2 + b2 [feed_forward]
    layernorm     the block's two LayerNorm calls                             [rest]
    residual      the block's code between them: the residual adds            [rest]

The profiled copy of the model has ``fused = False``: it runs its blocks one by one
(where the timers are) instead of its fused encoder. :func:`measure` also times the
plain ``forward`` (fused where the model has a fused path), interleaved with the timed
one, so the report shows both. :func:`profile` limits BLAS to ``threads`` threads while it
measures (:func:`attnlab.studies.measure.limit_threads`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import check_positive_int
from ..errors import AttnlabError
from ..messages import Message, msg, render, render_value
from ..models import BertConfig, BertModel
from ..nn.layers import EncoderBlock
from ..report.figures import new_figure
from ..report.fonts import font_context
from ..report.text import check_lang
from ..report.words import Lang
from .flops import (
    GROUPS,
    PARTS,
    ModelShape,
    crossovers,
    flop_counts,
    share_curve,
    shares,
)
from .measure import interleaved, limit_threads

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "TIME_PARTS", "TIME_GROUPS", "BERT_BASE", "TINY", "SCHEMA", "PartTimer",
    "random_bert", "with_max_positions", "timed_block", "profiled_layers", "profiled_forward",
    "measure", "profile", "plot_shares",
]

SCHEMA = "attnlab.studies.profile/3"

#: Part -> (group, what it times): the modules of a real block, in the order they run.
TIME_PARTS: dict[str, tuple[str, str]] = {
    "embeddings": ("rest", "BertModel.embed, with forward's input checks"),
    "attention": ("attention", "the block's MultiHeadAttention call: Q/K/V projections, "
                  "positions, QKᵀ, softmax, ·V, output projection"),
    "feed_forward": ("feed_forward", "the block's FeedForward call: X·W1 + b1, activation, "
                     "·W2 + b2"),
    "layernorm": ("rest", "the block's two LayerNorm calls"),
    "residual": ("rest", "the block's code between its modules: the residual adds"),
}

#: Group -> its measured parts (the FLOP groups "attention_core" and "projections" split
#: the attention call, which is timed as one).
TIME_GROUPS: dict[str, tuple[str, ...]] = {
    "attention": ("attention",),
    "feed_forward": ("feed_forward",),
    "rest": ("embeddings", "layernorm", "residual"),
}

BERT_BASE = BertConfig(
    vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
    intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2,
    layer_norm_eps=1e-12,
)
"""bert-base-uncased's shape: 12 layers, 768 wide, 12 heads, FFN 3072."""

TINY = BertConfig(
    vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12,
)
"""A 2-layer, 32-wide BERT for quick runs and tests."""


# -------------------------------------------------------------------- models


def random_bert(config: BertConfig = BERT_BASE, *, seed: int = 0, std: float = 0.02,
                name: str | None = None) -> BertModel:
    """A :class:`BertModel` of ``config``'s shape with random float32 weights, no files.

    Weights are N(0, std²) (BERT's initializer_range 0.02), biases 0, LayerNorm
    γ = 1, β = 0; built through the same constructor as a pretrained model, so
    the layers are attnlab's :class:`~attnlab.EncoderBlock`.
    """
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for key, shape in config.expected_tensors().items():
        if key.endswith("LayerNorm.weight"):
            tensors[key] = np.ones(shape, dtype=np.float32)
        elif key.endswith("bias"):
            tensors[key] = np.zeros(shape, dtype=np.float32)
        else:
            tensors[key] = (std * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return BertModel(config, tensors, tokenizer=None, max_length=config.max_position_embeddings,
                     name=name or f"random-L{config.num_hidden_layers}-E{config.hidden_size}")


def with_max_positions(model: BertModel, positions: int) -> BertModel:
    """A shallow copy of ``model`` whose position table has ``positions`` rows.

    Rows past the trained table repeat it (row p reads row p mod P): the cost of
    a forward pass does not depend on the values, and the first P rows give the
    model's own results. The layers are shared with ``model``.
    """
    positions = check_positive_int(positions, "positions")
    table = model.position_embeddings  # (P, E)
    if positions <= table.shape[0]:
        return model
    extended = copy.copy(model)
    extended.config = dataclasses.replace(model.config, max_position_embeddings=positions)
    reps = math.ceil(positions / table.shape[0])
    extended.position_embeddings = np.ascontiguousarray(np.tile(table, (reps, 1))[:positions])
    return extended


# -------------------------------------------------------------------- timing


class PartTimer:
    """Accumulates wall time per part: ``lap(part)`` charges the time since the last lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(TIME_PARTS, 0.0)
        self._last = time.perf_counter()

    def start(self) -> None:
        self._last = time.perf_counter()

    def lap(self, part: str) -> None:
        now = time.perf_counter()
        self.seconds[part] += now - self._last
        self._last = now


class _Timed:
    """A module (or method) behind a timing hook: the time since the last lap goes to
    ``before`` (the caller's own code), the call itself to ``part``.

    A module is called either checked (``module(x)``) or, below a boundary that
    checked its arguments, unchecked (``module.forward(x)``, and an attention's
    ``check_call``): all three are timed. Every other attribute is the module's.
    """

    _METHODS = ("forward", "check_call")

    def __init__(self, module: Any, part: str, clock: PartTimer, before: str) -> None:
        self._module, self._part, self._clock, self._before = module, part, clock, before

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._clock.lap(self._before)
        result = self._module(*args, **kwargs)
        self._clock.lap(self._part)
        return result

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._module, name)
        if name in self._METHODS and callable(found):
            return _Timed(found, self._part, self._clock, self._before)
        return found


#: The modules of an encoder block that get a timing hook, and their part.
_HOOKED = {"attn": "attention", "ffn": "feed_forward", "norm1": "layernorm",
           "norm2": "layernorm"}


def timed_block(block: EncoderBlock, clock: PartTimer) -> EncoderBlock:
    """A shallow copy of ``block`` whose modules are timed by ``clock``; ``block`` is untouched.

    The copy runs ``EncoderBlock.__call__`` itself, on the same weights: its output
    is the block's, bit for bit.
    """
    timed = copy.copy(block)
    for name, part in _HOOKED.items():
        if hasattr(block, name):
            setattr(timed, name, _Timed(getattr(block, name), part, clock, "residual"))
    return timed


def profiled_layers(
    layers: Sequence[EncoderBlock], x: Any, mask: Any = None, *, timer: PartTimer | None = None
) -> np.ndarray:
    """Run encoder blocks, timing their modules; equals ``layer(x, mask=mask)`` in turn.

    Shapes: x (B, T, E); mask bool broadcastable to (B, H, T, T), True = may attend
    (e.g. key padding as (B, 1, 1, T)) -> (B, T, E). The blocks check their inputs.
    """
    for index, layer in enumerate(layers):
        if layer.training:
            raise AttnlabError(f"layers[{index}]: expected evaluation mode (dropout off), "
                               "got training mode; call layer.eval()")
    clock = timer if timer is not None else PartTimer()
    blocks = [timed_block(layer, clock) for layer in layers]
    clock.start()
    hidden = x
    for block in blocks:
        hidden = block(hidden, mask=mask)  # (B, T, E)
        clock.lap("residual")  # the block's code after its last module
    return np.asarray(hidden)


def profiled_forward(
    model: BertModel, input_ids: Any, attention_mask: Any = None, *,
    timer: PartTimer | None = None,
) -> np.ndarray:
    """``model.forward(input_ids, attention_mask)`` on its blocks, timed by ``timer``.

    Shapes: input_ids int (B, T), attention_mask (B, T) with 1 = real token -> (B, T, E).
    The model's own ``forward`` runs (its checks, its mask, its loop over the blocks);
    ``fused = False`` on the timed copy makes it run the blocks rather than a fused encoder.
    """
    for index, layer in enumerate(model.layers):
        if layer.training:
            raise AttnlabError(f"model.layers[{index}]: expected evaluation mode (dropout "
                               "off), got training mode; call layer.eval()")
    clock = timer if timer is not None else PartTimer()
    hooked = copy.copy(model)
    hooked.layers = [timed_block(layer, clock) for layer in model.layers]
    hooked.embed = _Timed(model.embed, "embeddings", clock, "embeddings")  # type: ignore[method-assign]
    hooked.fused = False
    clock.start()
    hidden = hooked.forward(input_ids, attention_mask)
    clock.lap("residual")
    return hidden


def measure(model: BertModel, T: int, *, repeats: int = 5, batch: int = 1, seed: int = 0,
            compare_forward: bool = True) -> dict[str, Any]:
    """Time one model at one T: median seconds per part over ``repeats`` runs.

    One warm-up run first. With ``compare_forward`` the plain ``model.forward`` is
    timed too, interleaved with the hooked one (:func:`attnlab.studies.measure.
    interleaved`). Does not limit threads: see :func:`profile`.

    Returns {"T", "batch", "repeats", "seconds": {part: median}, "total_s" (sum of
    part medians), "forward_s" (median of model.forward, or None), "time_share"
    (parts and :data:`TIME_GROUPS`), "flops", "total_flops", "flop_share" (parts and
    :data:`~attnlab.studies.flops.GROUPS`)}.
    """
    T = check_positive_int(T, "T")
    repeats = check_positive_int(repeats, "repeats")
    batch = check_positive_int(batch, "batch")
    if T > model.config.max_position_embeddings:
        raise AttnlabError(f"T: expected at most {model.config.max_position_embeddings} "
                           f"(the model's position table), got {T}; see with_max_positions")
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000 if model.config.vocab_size > 2000 else 0,
                       model.config.vocab_size, size=(batch, T))  # (B, T)
    runs: dict[str, list[float]] = {part: [] for part in TIME_PARTS}
    timer = PartTimer()

    def hooked() -> None:
        timer.seconds = dict.fromkeys(TIME_PARTS, 0.0)
        profiled_forward(model, ids, timer=timer)

    def keep_parts(run: int) -> None:
        for part, elapsed in timer.seconds.items():
            runs[part].append(elapsed)

    calls: dict[str, Callable[[], Any]] = {"hooked": hooked}
    if compare_forward:
        calls["forward"] = lambda: model.forward(ids)
    for call in calls.values():
        call()  # warm-up
    timings = interleaved(calls, repeats, after_round=keep_parts)
    seconds = {part: float(np.median(values)) for part, values in runs.items()}
    flops = flop_counts(ModelShape.of(model), T, batch=batch)
    return {
        "T": T, "batch": batch, "repeats": repeats,
        "seconds": seconds,
        "total_s": float(sum(seconds.values())),
        "forward_s": timings["forward"].median if compare_forward else None,
        "time_share": shares(seconds, TIME_GROUPS),
        "flops": flops,
        "total_flops": int(sum(flops.values())),
        "flop_share": shares({k: float(v) for k, v in flops.items()}),
    }


def profile(
    models: Mapping[str, BertModel], seq_lens: Sequence[int], *, repeats: int = 5,
    threads: int = 1, batch: int = 1, seed: int = 0, compare_forward: bool = True,
    notes: Mapping[str, Sequence[str | Message]] | None = None,
    titles: Mapping[str, Message] | None = None, curve: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Measure every model at every T; the report the CLI prints and writes as JSON.

    A model whose position table is shorter than T is extended with
    :func:`with_max_positions` (and a note says so). ``notes`` and ``titles`` (by
    model name) may be keyed messages: the report keeps them as message dicts
    (:meth:`~attnlab.messages.Message.as_dict`), so that its text can be rendered in
    either language (:func:`~attnlab.messages.render_value`). Schema (``SCHEMA``)::

        {"schema", "settings": {threads, repeats, batch, dtype, seq_lens, flop_convention},
         "parts": {part: {"group", "description"}}, "groups": {group: [parts]},   (FLOPs)
         "time_parts": {...}, "time_groups": {...},                             (time)
         "models": [{"name", "title", "shape", "notes", "crossovers", "runs": [measure(...)],
                     "flop_curve": [{"T", part/group: share}, ...]}]}
    """
    seq_lens = [check_positive_int(T, "seq_lens") for T in seq_lens]
    if not seq_lens:
        raise AttnlabError("seq_lens: expected at least one sequence length, got none")
    grid = list(curve) if curve is not None else [2**k for k in range(4, 15)]
    dtypes = {str(m.layers[0].attn.Wq.dtype) for m in models.values() if m.layers}
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "settings": {
            "threads": threads, "repeats": repeats, "batch": batch, "seed": seed,
            "dtype": ", ".join(sorted(dtypes)), "seq_lens": seq_lens,
            "flop_convention": "matmul (m,k)·(k,n) = 2mkn; elementwise op or n-element "
                               "reduction = n (exp, erf, tanh count 1); mask select = 0",
        },
        "parts": {p: {"group": g, "description": d} for p, (g, d) in PARTS.items()},
        "groups": {g: list(members) for g, members in GROUPS.items()},
        "time_parts": {p: {"group": g, "description": d} for p, (g, d) in TIME_PARTS.items()},
        "time_groups": {g: list(members) for g, members in TIME_GROUPS.items()},
        "models": [],
    }
    with limit_threads(threads, feature="Profiling with a thread limit"):
        for name, model in models.items():
            model_notes: list[Any] = [note.as_dict() if isinstance(note, Message) else note
                                      for note in (notes or {}).get(name, ())]
            longest = max(seq_lens)
            P = model.config.max_position_embeddings
            if longest > P:
                model = with_max_positions(model, longest)
                model_notes.append(msg("profile.note.tiled", rows=P).as_dict())
            shape = ModelShape.of(model)
            runs = [measure(model, T, repeats=repeats, batch=batch, seed=seed,
                            compare_forward=compare_forward) for T in seq_lens]
            title = (titles or {}).get(name)
            report["models"].append({
                "name": name, "title": name if title is None else title.as_dict(),
                "shape": shape.as_dict(), "notes": model_notes,
                "crossovers": crossovers(shape), "runs": runs,
                "flop_curve": share_curve(shape, grid),
            })
    return report


# ---------------------------------------------------------------------- plot


def plot_shares(report: Mapping[str, Any], lang: Lang = "en") -> Figure:
    """Share vs T, one panel per model: FLOP-share curves, measured time shares as dots;
    the words in ``lang``."""
    models = report["models"]
    if not models:
        raise AttnlabError("report: expected at least one model, got none")
    lang = check_lang(lang)
    with font_context():  # a CJK font for the Chinese words, where one is installed
        return _plot_shares(models, lang)


def _plot_shares(models: Sequence[Mapping[str, Any]], lang: Lang) -> Figure:
    fig = new_figure((5.5 * len(models) + 1.5, 5.0), feature="attnlab profile plots")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    styles = {"attention": ("C3", msg("profile.plot.attention")),
              "attention_core": ("C1", msg("profile.plot.core")),
              "feed_forward": ("C0", msg("profile.plot.ffn")),
              "rest": ("C7", msg("profile.plot.rest"))}
    for ax, entry in zip(axes, models, strict=True):
        curve = entry["flop_curve"]
        Ts = [point["T"] for point in curve]
        for group, (colour, label) in styles.items():
            first = ax is axes[0]  # one legend entry per line style
            ax.plot(Ts, [point[group] for point in curve], color=colour,
                    label=render("profile.plot.flops", lang, part=label) if first else None)
            if all(group in run["time_share"] for run in entry["runs"]):  # not the core
                ax.plot([run["T"] for run in entry["runs"]],
                        [run["time_share"][group] for run in entry["runs"]], "o--",
                        color=colour, alpha=0.7, markersize=5,
                        label=render("profile.plot.time", lang, part=label) if first else None)
        ax.axhline(0.6, color="k", linestyle=":", linewidth=1)
        crossing = entry["crossovers"]["core_vs_ffn"]
        if crossing is not None:
            ax.axvline(crossing, color="C1", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1)
        ax.set_xlabel(render("profile.plot.x", lang))
        ax.set_ylabel(render("profile.plot.y", lang))
        ax.set_title(render_value(entry.get("title", entry["name"]), lang), fontsize=10)
        ax.grid(alpha=0.3)
    fig.suptitle(render("profile.plot.title", lang), fontsize=8)
    fig.legend(loc="outside lower center", ncol=4, fontsize=7)
    return fig
