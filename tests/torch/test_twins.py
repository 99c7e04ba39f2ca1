"""Every NumPy / torch twin pair takes the same parameters, in the same order, of the same
kinds, with the same defaults, so that the two cannot drift apart again.

A parameter that only one side has is listed here with its reason: torch's
``device``, ``dtype`` and ``generator``, dropout where a torch module has it (the
NumPy core keeps dropout in its own ``Dropout``), NumPy's ``seed`` and ``scheme``
(its init draws from a NumPy Generator, by name), and the handful of features one
side has not grown yet. Everything else must match name for name; a new
parameter on one side only fails here until it is added to its twin or listed.

Defaults are compared by value; a dtype default by its name (``np.float64`` and
``torch.float64`` are the same default), except where each framework's own default
float is meant (listed in ``dtype_defaults_differ``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

import attnlab
import attnlab.torch as at
from attnlab import gqa, masks, positional, positional_relative
from attnlab.fast import kv_cache, paged_cache, sparse, varlen
from attnlab.torch import gqa as torch_gqa

FRAMEWORK = {"device", "dtype", "generator"}  # torch's factory arguments


@dataclass
class Twin:
    name: str
    numpy: Any
    torch: Any
    numpy_only: set[str] = field(default_factory=set)
    torch_only: set[str] = field(default_factory=set)
    #: NumPy name -> torch name, where each framework's own idiom is kept.
    renamed: dict[str, str] = field(default_factory=dict)
    #: The leading inputs of a module call, which follow each side's convention.
    inputs: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    dtype_defaults_differ: bool = False
    #: Why the NumPy side does not match yet (an xfail until it does).
    pending: str = ""


TWINS = [
    # NumPy draws dropout from an explicit rng; torch from its own generator.
    Twin("scaled_dot_product_attention", attnlab.scaled_dot_product_attention,
         at.scaled_dot_product_attention, numpy_only={"rng"}, torch_only={"backend"}),
    Twin("softmax", attnlab.softmax, at.softmax, renamed={"axis": "dim"}),
    Twin("causal_mask", masks.causal_mask, at.causal_mask, torch_only={"device"}),
    Twin("window_mask", masks.window_mask, at.window_mask, torch_only={"device"}),
    Twin("sliding_window_mask", sparse.sliding_window_mask, at.sliding_window_mask,
         torch_only={"device"}),
    Twin("MultiHeadAttention", attnlab.MultiHeadAttention.init, at.MultiHeadAttention,
         numpy_only={"scheme", "seed"},
         # The NumPy core builds these from explicit arrays (MultiHeadAttention(Wq, ...)).
         torch_only={"generator", "device", "dropout", "value_head_dim", "d_out",
                     "rope_interleaved",
                     # torch's (T, B, E) layout option: the NumPy core is batch-first.
                     "batch_first",
                     # nn.MultiheadAttention's extra keys; the NumPy core (and its
                     # backward) has no counterpart yet.
                     "add_bias_kv", "add_zero_attn"},
         dtype_defaults_differ=True),  # float64 like the NumPy core, torch's default float
    Twin("MultiHeadAttention call", attnlab.MultiHeadAttention.__call__,
         at.MultiHeadAttention.forward, numpy_only={"recorder"},
         inputs=(("x", "context", "value"), ("query", "key", "value"))),
    Twin("SelfAttentionLayer", attnlab.SelfAttentionLayer, at.SelfAttentionLayer,
         numpy_only={"scheme", "seed"},
         # RoPE, ALiBi and bias-free projections exist on the NumPy layer's attention only.
         torch_only=FRAMEWORK | {"use_bias", "rope", "rope_base", "rope_interleaved", "alibi"}),
    Twin("SelfAttentionLayer call", attnlab.SelfAttentionLayer.__call__,
         at.SelfAttentionLayer.forward, numpy_only={"recorder"}),
    Twin("LayerNorm", attnlab.LayerNorm, at.LayerNorm, numpy_only={"gamma", "beta"},
         torch_only={"device", "dtype"}),
    Twin("LayerNorm call", attnlab.LayerNorm.__call__, at.LayerNorm.forward),
    Twin("PositionalEncoding", positional.SinusoidalPositionalEncoding, at.PositionalEncoding,
         torch_only={"dropout", "device", "dtype"}),
    Twin("PositionalEncoding call", positional.SinusoidalPositionalEncoding.__call__,
         at.PositionalEncoding.forward),
    Twin("sinusoidal_encoding", positional.sinusoidal_encoding, at.sinusoidal_encoding,
         torch_only={"device"}),
    Twin("rope_angles", positional_relative.rope_angles, at.rope_angles, torch_only={"device"}),
    Twin("apply_rope", positional_relative.apply_rope, at.apply_rope),
    Twin("alibi_slopes", positional_relative.alibi_slopes, at.alibi_slopes, torch_only={"device"}),
    Twin("alibi_bias", positional_relative.alibi_bias, at.alibi_bias, torch_only={"device"}),
    Twin("KVCache", kv_cache.KVCache, at.KVCache, torch_only={"device"},
         dtype_defaults_differ=True),  # float64 like the NumPy core, float32 like torch
    Twin("SlidingWindowKVCache", kv_cache.SlidingWindowKVCache, at.SlidingWindowKVCache,
         torch_only={"device"}, dtype_defaults_differ=True),
    Twin("repeat_kv", gqa.repeat_kv, torch_gqa.repeat_kv),
    Twin("gqa_reduce", gqa.gqa_reduce, torch_gqa.gqa_reduce),
    Twin("varlen_attention", varlen.varlen_attention, at.varlen_attention),
    Twin("PagedKVCache", paged_cache.PagedKVCache, at.PagedKVCache, torch_only={"device"},
         dtype_defaults_differ=True),  # float64 like the NumPy core, float32 like torch
    *(Twin(f"PagedKVCache.{method}", getattr(paged_cache.PagedKVCache, method),
           getattr(at.PagedKVCache, method))
      for method in ("attend", "append", "add_sequence", "free", "length", "block_table",
                     "keys", "values")),
    *(Twin(f"{cls}.{method}", getattr(getattr(kv_cache, cls), method),
           getattr(getattr(at, cls), method))
      for cls in ("KVCache", "SlidingWindowKVCache")
      for method in ("attend", "append", "next_positions", "reset")),
]


def _default(value: Any) -> Any:
    """A default, comparable across frameworks: dtypes by name."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, type) and issubclass(value, np.generic) or isinstance(value, np.dtype):
        return np.dtype(value).name
    return value


def _parameters(fn: Any, one_sided: set[str], inputs: tuple[str, ...]) -> list[inspect.Parameter]:
    params = [p for name, p in inspect.signature(fn).parameters.items() if name != "self"]
    names = [p.name for p in params]
    missing = (one_sided | set(inputs)) - set(names)
    assert not missing, f"listed as one-sided but not a parameter: {sorted(missing)}"
    assert names[: len(inputs)] == list(inputs), f"expected the inputs {inputs} first"
    return [p for p in params[len(inputs):] if p.name not in one_sided]


def compare(twin: Twin) -> None:
    numpy_params = _parameters(twin.numpy, twin.numpy_only, twin.inputs[0])
    torch_params = _parameters(twin.torch, twin.torch_only, twin.inputs[1])
    numpy_names = [twin.renamed.get(p.name, p.name) for p in numpy_params]
    torch_names = [p.name for p in torch_params]
    assert numpy_names == torch_names, (
        f"{twin.name}: parameters differ: NumPy {numpy_names}, torch {torch_names}"
    )
    for a, b in zip(numpy_params, torch_params, strict=True):
        assert a.kind == b.kind, f"{twin.name}: {b.name} is {a.kind} in NumPy, {b.kind} in torch"
        if a.name == "dtype" and twin.dtype_defaults_differ:
            continue
        assert _default(a.default) == _default(b.default), (
            f"{twin.name}: {b.name} defaults to {a.default!r} in NumPy, {b.default!r} in torch"
        )
    for fn, one_sided in ((twin.numpy, twin.numpy_only), (twin.torch, twin.torch_only)):
        positional_one_sided = [
            p.name for p in inspect.signature(fn).parameters.values()
            if p.name in one_sided and p.kind is not inspect.Parameter.KEYWORD_ONLY
        ]
        # Positions must mean the same on both sides: one-sided parameters are keywords.
        assert not positional_one_sided, f"{twin.name}: {positional_one_sided} positional"


@pytest.mark.parametrize("twin", [
    pytest.param(t, marks=pytest.mark.xfail(strict=True, reason=t.pending)) if t.pending else t
    for t in TWINS
], ids=[t.name for t in TWINS])
def test_twins_have_the_same_parameters(twin):
    compare(twin)


@pytest.mark.parametrize("name", ["KVCache", "SlidingWindowKVCache", "PagedKVCache"])
def test_caches_have_the_same_public_members(name):
    def public(cls):
        return {m for m in dir(cls) if not m.startswith("_")}

    numpy_twin = getattr(paged_cache if name == "PagedKVCache" else kv_cache, name)
    assert public(numpy_twin) == public(getattr(at, name))


def test_every_torch_export_has_its_twin_here():
    """A new public function or class in attnlab.torch needs a twin (or a reason)."""
    no_twin = {
        # Conversions and the debug switch belong to the torch layer itself.
        "from_numpy", "to_numpy", "from_torch_multihead", "to_torch_multihead",
        "debug_checks", "debug_checks_enabled",
    }
    paired = {t.torch.__qualname__.split(".")[0] for t in TWINS}
    assert set(at.__all__) - no_twin <= paired, sorted(set(at.__all__) - no_twin - paired)


def test_seed_001_positional_forms_still_work():
    """Seed 001 writes MultiHeadAttention(h, d_model), SelfAttentionLayer(d_model, h, dropout)
    and PositionalEncoding(d_model, max_len): positions, not names."""
    mha = at.MultiHeadAttention(8, 64)
    assert (mha.num_heads, mha.d_model) == (8, 64)
    layer = at.SelfAttentionLayer(64, 8, 0.2)
    assert (layer.self_attn.num_heads, layer.dropout.p) == (8, 0.2)
    assert at.PositionalEncoding(64, 100).max_len == 100
