"""Hook points on Hugging Face transformers models, under attnlab's names.

:func:`install` gives a transformers model (a torch module with a ``config``) what
:mod:`attnlab.hooks` needs: ``hook_points()`` and ``hook_site`` on the model, on each
of its ``config.num_hidden_layers`` layers and on each layer's attention module.
Then :func:`attnlab.lens.run_with_cache` and :func:`attnlab.lens.run_with_hooks`
work on it, with the names (layers 0-based; B batch, H heads, Hkv key/value
heads, T query length, S key length, D head dim, E model width)::

    blocks.{l}.hook_resid_pre          (B, T, E)       the layer's input
    blocks.{l}.attn.hook_q             (B, H, T, D)    after RoPE, where there is RoPE
    blocks.{l}.attn.hook_k, hook_v     (B, Hkv, S, D)  with the cache's keys, after RoPE
    blocks.{l}.attn.hook_attn_scores   (B, H, T, S)    scaled, soft-capped, masked -inf
    blocks.{l}.attn.hook_pattern       (B, H, T, S)    the weights (sinks take their share)
    blocks.{l}.attn.hook_z             (B, H, T, D)    each head's output before o_proj
    blocks.{l}.hook_resid_mid          (B, T, E)       the stream the MLP side reads
    blocks.{l}.hook_resid_post         (B, T, E)       the layer's output

The ``attn`` points are called by attnlab's attention function
(:mod:`attnlab.hf.attention`), so they need the model on an implementation
registered by :func:`attnlab.hf.register` (``attn_implementation="attnlab"``); only
a layer whose ``hook_attn_scores`` or ``hook_pattern`` is asked for computes its
(T, S) matrix, by the plain path, from the q, k and mask the model passed; the
others stay fused. The ``resid`` points are read with torch module hooks on the
layer (``resid_mid`` at the input of the MLP side's first module: a read-only
point, since each architecture keeps its own copy of the residual there).

The layer list is the model's ``nn.ModuleList`` of ``config.num_hidden_layers``
entries; a layer's attention module is its deepest submodule whose class name
contains "Attention" (``LlamaAttention``, ``GPT2Attention``, ``BertSelfAttention``).
"""

from __future__ import annotations

import functools
from typing import Any

from ..errors import AttnlabError

__all__ = ["ATTENTION_POINTS", "LAYER_POINTS", "MLP_SIDE", "attention_modules", "install",
           "is_hf_model", "output_projection"]

ATTENTION_POINTS = ["hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z"]
LAYER_POINTS = ["hook_resid_pre", "hook_resid_mid", "hook_resid_post"]
#: The module a layer's MLP side starts with, by the names transformers' models use
#: (first match wins: Gemma 2's post_attention_layernorm normalises the attention
#: output, its pre_feedforward_layernorm reads the stream).
MLP_SIDE = ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2", "intermediate")


def is_hf_model(model: Any) -> bool:
    """A torch module with a transformers-style ``config`` and no hook points of its own."""
    return (not callable(getattr(model, "hook_points", None))
            and hasattr(model, "config") and hasattr(model, "named_modules")
            and getattr(model.config, "num_hidden_layers", None) is not None)


def install(model: Any) -> Any:
    """Give a transformers ``model`` attnlab's hook points (see the module docs); returns
    it. Idempotent; nothing changes while no hook is attached."""
    if getattr(model, "_attnlab_hook_layers", None) is not None:
        return model
    import torch

    layers = _layers(model, torch.nn.ModuleList)
    children: list[str | tuple[str, Any]] = []
    for index, layer in enumerate(layers):
        attention = _attention_module(layer, index)
        attention.hook_site = None
        attention.hook_points = ATTENTION_POINTS.copy
        layer.hook_site = None
        # partials, not closures or a list's bound method: copy.deepcopy(model) copies a
        # partial's arguments, so a copy's points sit on the copy's own modules
        layer.hook_points = functools.partial(_layer_points, attention)
        layer.register_forward_pre_hook(_resid_pre, with_kwargs=True)
        layer.register_forward_hook(_resid_post)
        mlp_side = _mlp_side(layer, index)
        mlp_side.register_forward_pre_hook(functools.partial(_resid_mid, layer),
                                           with_kwargs=True)
        children.append((f"blocks.{index}", layer))
    model.hook_site = None
    model.hook_points = functools.partial(list, children)
    model._attnlab_hook_layers = len(layers)
    return model


def attention_modules(model: Any) -> list[Any]:
    """Each layer's attention module (the one whose ``attn`` points are
    ``blocks.{l}.attn.*``), in layer order; installs the hook points if needed."""
    install(model)
    modules = []
    for _, layer in model.hook_points():
        modules += [child for child in layer.hook_points()
                    if isinstance(child, tuple) and child[0] == "attn"]
    return [module for _, module in modules]


def output_projection(model: Any, attention: Any) -> Any:
    """The module that maps the concatenated heads (.., H·Dv) to the model width: W_O."""
    for attribute in ("o_proj", "c_proj", "out_proj", "dense", "o"):
        found = getattr(attention, attribute, None)
        if found is not None and callable(found):
            return found
    # BERT: BertSelfAttention's output goes to its parent's output.dense.
    names = {module: name for name, module in model.named_modules()}
    parent_name = names.get(attention, "").rpartition(".")[0]
    parent = model.get_submodule(parent_name) if parent_name else None
    dense = getattr(getattr(parent, "output", None), "dense", None)
    if dense is None:
        raise AttnlabError(f"model: cannot find the output projection of "
                           f"{type(attention).__name__}")
    return dense


def check_attention_implementation(model: Any, names: list[str]) -> None:
    """Refuse attention points on a model whose attention is not attnlab's: transformers'
    own functions call no hook point."""
    if not any(".attn." in name for name in names):
        return
    from transformers import AttentionInterface

    implementation = str(getattr(model.config, "_attn_implementation", None))
    function = AttentionInterface._global_mapping.get(implementation)
    if getattr(function, "attnlab_backend", None) is None:
        raise AttnlabError(
            f"names: the attention points ({names[0]}, ...) are read by attnlab's attention "
            f"function, but this model runs attn_implementation={implementation!r}; call "
            "attnlab.hf.register() and model.set_attn_implementation('attnlab')")


def _layers(model: Any, module_list: type) -> Any:
    count = model.config.num_hidden_layers
    for _, module in model.named_modules():
        if isinstance(module, module_list) and len(module) == count:  # type: ignore[arg-type]
            return module
    raise AttnlabError(f"model: expected a list of config.num_hidden_layers = {count} layers "
                       f"in {type(model).__name__}, found none")


def _attention_module(layer: Any, index: int) -> Any:
    found = [m for _, m in layer.named_modules() if "Attention" in type(m).__name__]
    deepest = [m for m in found
               if not any(o is not m and "Attention" in type(o).__name__ for _, o in
                          m.named_modules())]
    if len(deepest) != 1:
        raise AttnlabError(f"model: expected one attention module in layer {index} "
                           f"({type(layer).__name__}), found {len(deepest)}")
    return deepest[0]


def _mlp_side(layer: Any, index: int) -> Any:
    for name in MLP_SIDE:
        module = getattr(layer, name, None)
        if module is not None:
            return module
    raise AttnlabError(f"model: layer {index} ({type(layer).__name__}) has none of the modules "
                       f"the MLP side starts with ({', '.join(MLP_SIDE)}): no hook_resid_mid")


def _layer_points(attention: Any) -> list[str | tuple[str, Any]]:
    return ["hook_resid_pre", ("attn", attention), "hook_resid_mid", "hook_resid_post"]


def _resid_pre(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    site = layer.hook_site
    if site is None:
        return None
    if args:
        return (site("hook_resid_pre", args[0]), *args[1:]), kwargs
    kwargs["hidden_states"] = site("hook_resid_pre", kwargs["hidden_states"])
    return args, kwargs


def _resid_post(layer: Any, args: Any, output: Any) -> Any:
    site = layer.hook_site
    if site is None:
        return None
    if isinstance(output, tuple):
        return (site("hook_resid_post", output[0]), *output[1:])
    return site("hook_resid_post", output)


def _resid_mid(layer: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    site = layer.hook_site
    if site is None:
        return None
    value = args[0] if args else next(iter(kwargs.values()))
    if site("hook_resid_mid", value) is not value:
        raise AttnlabError(
            f"hook {site.prefix}hook_resid_mid: read-only on Hugging Face models (the "
            "layer keeps its own copy of the residual there); edit hook_resid_pre, an "
            "attention point or hook_resid_post instead")
    return None
