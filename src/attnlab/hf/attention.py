"""attnlab as a Hugging Face attention implementation: an adapter, not a second attention.

Hugging Face transformers (5.x) calls a registered attention function as::

    attn_output, attn_weights = fn(module, query, key, value, attention_mask, **kwargs)
    # query (B, H, T, D), key and value (B, Hkv, S, D) -> (B, T, H, Dv), (B, H, T, S) | None

and builds ``attention_mask`` with the mask function registered under the same
name. This module converts the conventions at that boundary and calls attnlab's
kernels (:func:`attnlab.torch.scaled_dot_product_attention`); it computes nothing
itself.

What transformers passes, and what it becomes:

- ``attention_mask``: bool (B, 1, T, S), True = may attend (``sdpa_mask``'s
  output, attnlab's own convention) -> ``mask``; a float mask (``eager_mask``, or
  one given by the caller) is additive -> ``bias``; ``None`` -> no mask, and then
  ``is_causal`` (the kwarg, else ``module.is_causal``) means causal for T > 1 with
  **top-left** alignment, as torch's sdpa: transformers leaves the mask out only
  where that is right (T == S, or the prefill of an empty ``StaticCache``, where
  S > T and the keys past T are empty slots).
- ``scaling`` -> ``scale``; ``dropout`` -> ``dropout_p`` (transformers passes 0
  in eval mode); ``softcap`` -> ``softcap`` (Gemma 2); ``s_aux`` or
  ``module.sinks`` -> ``sinks`` (GPT-OSS); Hkv < H -> ``enable_gqa`` (the head
  h reads key/value head h // (H / Hkv), as ``repeat_kv``).
- ``sliding_window``: already in the mask that the mask function built from the
  cache positions (Mistral, Gemma 2, GPT-OSS); a call with a window, no mask and
  more keys than the window is refused rather than computed without it.
- ``output_attentions=True`` returns the weights (B, H, T, S) to transformers (passed
  down, or, for models that keep it to themselves such as GPT-2, read from
  transformers' output recorder).
- Keywords that only describe the call (``position_ids``, ``cache_position``,
  ``use_cache``, ``output_hidden_states`` ...) are ignored; any other keyword with
  a value is refused by name (``cu_seq_lens_q`` of packed batches, T5's
  ``position_bias``, ...), never dropped.

Backends: ``"torch"`` the fused path of attnlab.torch (torch's fused kernel
given exactly what makes it equal the plain path), ``"plain"`` attnlab's plain
path, op for op the NumPy core (float64 included), ``"triton"`` attnlab's Triton
kernels (CUDA tensors; masks that are key padding, with or without the causal
rule).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..checks import shape_str
from ..errors import AttnlabError
from ..torch import scaled_dot_product_attention
from ..torch.gqa import repeat_kv
from ..torch.kernel import scaled_scores, stable_softmax

__all__ = ["BACKENDS", "ACCEPTED_KWARGS", "attention_function", "check_backend"]

#: The backends of :func:`attnlab.hf.register`, and what each runs.
BACKENDS = {
    "torch": "attnlab.torch's fused path",
    "plain": "attnlab's plain path (op for op the NumPy core; float64 capable)",
    "triton": "attnlab.triton's flash kernels (CUDA)",
}

#: Keywords the adapter reads (``scaling``, ``dropout``, ``softcap``, ``s_aux``,
#: ``sliding_window``, ``is_causal``, ``output_attentions``) and those transformers passes
#: down to every attention function that say nothing about the attention itself
#: (positions are already in q and k; the cache has already been updated).
ACCEPTED_KWARGS = frozenset({
    "position_ids", "cache_position", "use_cache", "output_hidden_states",
    "output_router_logits", "return_dict", "num_items_in_batch", "layer_idx", "is_causal",
    "position_embeddings", "past_key_values", "cache", "token_type_ids", "layer_type",
    "max_length_q", "max_length_k", "seq_idx", "output_attentions", "sliding_window",
    "softcap", "s_aux", "dropout", "scaling",
})


def check_backend(backend: Any) -> str:
    if backend not in BACKENDS:
        raise AttnlabError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, "
                           f"got {backend!r}")
    return str(backend)


def _refuse_unknown(kwargs: dict[str, Any]) -> None:
    for name, value in kwargs.items():
        if name in ACCEPTED_KWARGS or value is None or value is False:
            continue
        raise AttnlabError(
            f"{name}: attnlab's Hugging Face attention does not implement this keyword, got "
            f"{_describe(value)}; use attn_implementation='eager' or 'sdpa' for this model or "
            "call")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {shape_str(tuple(value.shape))}"
    return repr(value)


def _weights_wanted(kwargs: dict[str, Any]) -> bool:
    """Whether transformers wants this call's weights: ``output_attentions=True`` passed down,
    or (models that take it out of the kwargs, GPT-2) its output recorder collecting
    attentions for this forward."""
    if kwargs.get("output_attentions"):
        return True
    if torch.compiler.is_compiling():  # the recorder's ContextVar does not trace
        return False
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # another transformers: only output_attentions says it
        return False
    collecting = _active_collector.get()
    return isinstance(collecting, dict) and "attentions" in collecting


def attention_function(backend: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
    """The attention function registered for ``backend`` (one function object per backend,
    so that registering it again changes nothing)."""
    return _FUNCTIONS[check_backend(backend)]


def _convert(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
    attention_mask: torch.Tensor | None, kwargs: dict[str, Any],
) -> dict[str, Any]:
    """transformers' call -> the keyword arguments of attnlab's sdpa (see the module docs)."""
    _refuse_unknown(kwargs)
    T, S = query.shape[-2], key.shape[-2]
    options: dict[str, Any] = {"scale": kwargs.get("scaling"),
                               "dropout_p": float(kwargs.get("dropout") or 0.0),
                               "softcap": kwargs.get("softcap"),
                               "enable_gqa": query.shape[-3] != key.shape[-3]}
    sinks = kwargs.get("s_aux")
    if sinks is None:
        sinks = getattr(module, "sinks", None)
    if sinks is not None:
        options["sinks"] = sinks
    window = kwargs.get("sliding_window")
    if attention_mask is None:
        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        if window is not None and S > int(window):
            raise AttnlabError(
                f"sliding_window: expected the mask function to have built the window "
                f"{window} into attention_mask, got no mask for {S} keys")
        if bool(is_causal) and T > 1:  # transformers means torch's top-left rule here
            options.update(is_causal=True, causal_alignment="top_left")
    elif attention_mask.dtype == torch.bool:
        options["mask"] = attention_mask  # (B, 1, T, S) True = may attend
    else:
        options["bias"] = attention_mask.to(query.dtype)  # (B, 1, T, S) additive
    return options


def _hooked(
    site: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    options: dict[str, Any], want_weights: bool, plain: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # -> (B, H, T, Dv), (B, H, T, S) | None
    """Attention with the module's hook points (:mod:`attnlab.lens.hf_points`): q, k, v
    through their points; the scores and the pattern made (by the plain path's own steps)
    only when a hook asks for one of them; z through its point."""
    query = site("hook_q", query)  # (B, H, T, D)
    key = site("hook_k", key)  # (B, Hkv, S, D)
    value = site("hook_v", value)  # (B, Hkv, S, Dv)
    mask = options.pop("mask", None)
    if site.wants("hook_attn_scores") or site.wants("hook_pattern"):
        out, weights = _explicit(site, query, key, value, mask, options)
    elif want_weights or plain:
        out, weights = scaled_dot_product_attention(query, key, value, mask,
                                                    return_weights=True, **options)
    else:
        out, weights = scaled_dot_product_attention(query, key, value, mask, **options), None
    return site("hook_z", out), (weights if want_weights else None)


def _explicit(
    site: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
    options: dict[str, Any],
) -> tuple[torch.Tensor, torch.Tensor]:  # -> (B, H, T, Dv), (B, H, T, S)
    """The plain path's steps one by one, so that hook_attn_scores and hook_pattern see (and
    may replace) each: the scores (B, H, T, S) with -inf where not allowed, the pattern
    (with each head's sink in the softmax when there are sinks), its product with v."""
    T, S = q.shape[-2], k.shape[-2]
    H, Hkv = q.shape[-3], k.shape[-3]
    k = repeat_kv(k, H // Hkv)  # (B, H, S, D): query head h reads key/value head h // (H/Hkv)
    v = repeat_kv(v, H // Hkv)  # (B, H, S, Dv)
    allowed = mask
    if options.get("is_causal"):  # transformers' top-left rule (see _convert)
        top_left = torch.ones(T, S, dtype=torch.bool, device=q.device).tril()  # (T, S)
        allowed = top_left if allowed is None else allowed & top_left
    scale = options["scale"] if options.get("scale") is not None else q.shape[-1] ** -0.5
    scores = site("hook_attn_scores", scaled_scores(
        q, k, allowed, options.get("bias"), scale,
        softcap=options.get("softcap")))  # (B, H, T, S)
    sinks = options.get("sinks")
    if sinks is not None:  # each head's sink joins the softmax and takes no value
        column = sinks.to(scores.dtype)[:, None, None].expand(*scores.shape[:-1], 1)
        weights = stable_softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    else:
        weights = stable_softmax(scores, dim=-1)  # (B, H, T, S)
    weights = site("hook_pattern", weights)
    p = options.get("dropout_p", 0.0)
    dropped = torch.nn.functional.dropout(weights, p=p, training=True) if p else weights
    return dropped @ v.to(dropped.dtype), weights  # (B, H, T, Dv), (B, H, T, S)


def _kernel_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, *, plain: bool, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # -> (B, T, H, Dv), (B, H, T, S) | None
    """attnlab.torch's attention: the fused path, or with ``plain`` the plain one always."""
    options = _convert(module, query, key, attention_mask, kwargs)
    wanted = _weights_wanted(kwargs)
    site = getattr(module, "hook_site", None)
    if site is not None:
        out, weights = _hooked(site, query, key, value, options, wanted, plain=plain)
        return out.transpose(1, 2).contiguous(), weights
    mask = options.pop("mask", None)
    if plain or wanted:  # return_weights=True takes the plain path
        out, weights = scaled_dot_product_attention(query, key, value, mask,
                                                    return_weights=True, **options)
        return out.transpose(1, 2).contiguous(), (weights if wanted else None)
    out = scaled_dot_product_attention(query, key, value, mask, **options)  # (B, H, T, Dv)
    return out.transpose(1, 2).contiguous(), None


def _triton_attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:  # -> (B, T, H, Dv), None
    if query.device.type != "cuda":
        raise AttnlabError(
            f"backend: 'triton' runs attnlab's Triton kernels on CUDA tensors, got a model on "
            f"{query.device.type!r}; register(backend='torch') or 'plain' on the CPU")
    if getattr(module, "hook_site", None) is not None:
        raise AttnlabError("hooks: backend='triton' has no hook points; register(backend="
                           "'torch') to read or edit q, k, v, the scores, the pattern or z")
    options = _convert(module, query, key, attention_mask, kwargs)
    for name in ("softcap", "sinks", "bias"):
        if options.get(name) is not None:
            raise AttnlabError(f"{name}: backend='triton' computes attention without it; use "
                               "register(backend='torch') for this model")
    if options.pop("dropout_p"):
        raise AttnlabError("dropout: backend='triton' has no dropout; use backend='torch' to "
                           "train with attention dropout")
    if _weights_wanted(kwargs):
        raise AttnlabError("output_attentions: backend='triton' builds no (T, S) weights; use "
                           "backend='torch' or 'plain'")
    mask = options.pop("mask", None)
    is_causal = bool(options.pop("is_causal", False))
    T, S = query.shape[-2], key.shape[-2]
    if is_causal and S > T:  # an empty StaticCache's prefill: the keys past T are empty slots
        key, value, S = key[..., :T, :], value[..., :T, :], T
    key_padding = None
    if mask is not None:
        key_padding, is_causal = _as_key_padding(mask, T, S)
    from ..triton import flash_attention  # CUDA only: imported when a model runs on it

    out = flash_attention(query, key, value, is_causal=is_causal, key_padding=key_padding,
                          scale=options["scale"])  # (B, H, T, Dv)
    return out.transpose(1, 2).contiguous(), None


def _as_key_padding(mask: torch.Tensor, T: int, S: int) -> tuple[torch.Tensor, bool]:
    """A (B, 1, T, S) bool mask as (key padding (B, S), bottom-right causal), when it is one."""
    key_padding = mask[:, 0, -1, :]  # (B, S): the last query sees every real key
    for causal in (False, True):
        rebuilt = key_padding[:, None, None, :].expand(mask.shape[0], 1, T, S)
        if causal:
            rule = torch.ones(T, S, dtype=torch.bool, device=mask.device).tril(S - T)
            rebuilt = rebuilt & rule
        if torch.equal(rebuilt, mask.expand_as(rebuilt)):
            return key_padding, causal
    raise AttnlabError(
        f"attention_mask: backend='triton' takes key padding, with or without the causal rule; "
        f"got a (B, 1, T, S) = {shape_str(tuple(mask.shape))} mask that is neither (a sliding "
        "window or a cache's positions); use backend='torch'")


_FUNCTIONS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor | None]]] = {
    "torch": functools.partial(_kernel_attention, plain=False),
    "plain": functools.partial(_kernel_attention, plain=True),
    "triton": _triton_attention,
}
for _backend, _function in _FUNCTIONS.items():
    # How attnlab.lens.hf_points recognises attnlab's functions in transformers' registry.
    _function.attnlab_backend = _backend  # type: ignore[attr-defined]
