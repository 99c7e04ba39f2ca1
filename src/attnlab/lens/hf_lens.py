"""The lens on Hugging Face models, through attnlab's hook points (:mod:`attnlab.hf`).

A model loaded with ``attn_implementation="attnlab"`` (after :func:`attnlab.hf.register`)
exposes ``blocks.{l}.attn.hook_z`` (B, H, T, D: each head's output before W_O) and
``blocks.{l}.hook_resid_post`` (B, T, E); everything here edits or reads those points
with :func:`attnlab.lens.run_with_hooks` / :func:`~attnlab.lens.run_with_cache`:

- :func:`ablate_heads`: zero a head's z (equal to zeroing its columns of W_O, ``o_proj``)
  or replace it by its mean over the positions (mean ablation); returns the logits.
- :func:`head_importance`: |∂ metric / ∂ g_{l,h}| for a gate g multiplying each head's z,
  at g = 1, by torch autograd (Michel et al. 2019).
- :func:`logit_lens`: each layer's residual stream through the final norm and the
  unembedding (nostalgebraist 2020); at the last layer it is the model's own logits.
- :func:`repeated_tokens_scores`: TransformerLens's previous-token, duplicate-token and
  induction scores on a random sequence repeated twice.

(B, H, T) legend: B batch, H heads, T tokens, D head dim, E model width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import AttnlabError

__all__ = ["ablate_heads", "final_norm_and_unembed", "head_importance", "logit_lens",
           "repeated_tokens_scores"]


def _heads(heads: Any, L: int, H: int) -> dict[int, list[int]]:
    """[(layer, head), ...] 0-based -> {layer: [heads]}, checked."""
    by_layer: dict[int, list[int]] = {}
    for item in heads:
        if not (isinstance(item, (tuple, list)) and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
                and 0 <= item[0] < L and 0 <= item[1] < H):
            raise AttnlabError(f"heads: expected (layer, head) pairs with layer in [0, {L}) "
                               f"and head in [0, {H}), got {item!r}")
        by_layer.setdefault(item[0], []).append(item[1])
    return by_layer


def _shape(model: Any) -> tuple[int, int]:
    config = model.config
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def ablate_heads(model: Any, heads: Sequence[tuple[int, int]], *, how: str = "zero",
                 **inputs: Any) -> Any:
    """The model's output with ``heads`` [(layer, head), ...] ablated.

    ``how="zero"``: the head's z is 0 at every position, which is what zeroing its
    D columns of W_O does (its bias, if any, stays). ``how="mean"``: z is replaced by its
    mean over the batch and positions of this same input (so the head still adds its
    average contribution). ``inputs`` go to the model (``input_ids``, ...).
    """
    from . import run_with_hooks

    if how not in ("zero", "mean"):
        raise AttnlabError(f"how: expected 'zero' or 'mean', got {how!r}")
    by_layer = _heads(heads, *_shape(model))

    def edit(z: Any, name: str) -> Any:  # z: (B, H, T, D)
        layer = int(name.split(".")[1])
        z = z.clone()
        for head in by_layer[layer]:
            z[:, head] = 0.0 if how == "zero" else z[:, head].mean(dim=(0, 1), keepdim=True)
        return z

    hooks = [(f"blocks.{layer}.attn.hook_z", edit) for layer in by_layer]
    return run_with_hooks(model, hooks=hooks, **inputs)


def head_importance(model: Any, metric: Callable[[Any], Any], **inputs: Any) -> np.ndarray:
    """(L, H) |∂ metric(output) / ∂ g_{l,h}| at g = 1, g a gate on each head's z.

    ``metric`` maps the model's output to a scalar tensor (e.g. the log-probability of
    the right next token). The gates are the only leaves asked for; the weights'
    gradients are not accumulated.
    """
    import torch

    from . import run_with_hooks

    L, H = _shape(model)
    gates = torch.ones(L, H, requires_grad=True)

    def gate(z: Any, name: str) -> Any:  # z: (B, H, T, D)
        layer = int(name.split(".")[1])
        return z * gates[layer].to(z.dtype)[None, :, None, None]

    output = run_with_hooks(model, hooks=[(lambda n: n.endswith("attn.hook_z"), gate)],
                            **inputs)
    value = metric(output)
    if not (isinstance(value, torch.Tensor) and value.numel() == 1):
        raise AttnlabError("metric: expected a function returning a scalar tensor")
    (grad,) = torch.autograd.grad(value, gates)
    return grad.abs().double().numpy()


def final_norm_and_unembed(model: Any) -> tuple[Any, Any]:
    """(final norm, unembedding) modules of a causal LM: Llama-like ``model.norm``,
    GPT-2's ``transformer.ln_f``; ``get_output_embeddings()``."""
    body = getattr(model, "model", None) or getattr(model, "transformer", None)
    norm = None
    for name in ("norm", "ln_f", "final_layer_norm"):
        norm = getattr(body, name, None) if body is not None else None
        if norm is not None:
            break
    unembed = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if norm is None or unembed is None:
        raise AttnlabError(f"model: {type(model).__name__} has no final norm and unembedding "
                           "that the logit lens knows (a causal language model is needed)")
    return norm, unembed


def logit_lens(model: Any, **inputs: Any) -> tuple[np.ndarray, np.ndarray]:
    """(lens (L, T, V), the model's logits (T, V)) for batch item 0: layer l's residual
    stream after its block, through the final norm and the unembedding."""
    import torch

    from . import run_with_cache

    L, _ = _shape(model)
    norm, unembed = final_norm_and_unembed(model)
    names = [f"blocks.{layer}.hook_resid_post" for layer in range(L)]
    with torch.no_grad():
        output, cache = run_with_cache(model, names=names, **inputs)
        lens = torch.stack([unembed(norm(cache[name][0])) for name in names])  # (L, T, V)
    return lens.double().numpy(), output.logits[0].double().numpy()


def repeated_tokens_scores(model: Any, *, length: int = 20, seed: int = 0,
                           first: int | None = None) -> dict[str, np.ndarray]:
    """TransformerLens's detectors on [first] + r + r, r ``length`` random token ids
    (as TransformerLens does for induction): {name: (L, H)} with the first token excluded.
    """
    import torch

    from . import run_with_cache
    from .heads import all_head_scores

    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        raise AttnlabError(f"length: expected an int >= 2, got {length!r}")
    vocabulary = int(model.config.vocab_size)
    generator = np.random.default_rng(seed)
    random = generator.integers(100, vocabulary, size=length)
    ids = np.concatenate([[first if first is not None else random[0]], random, random])
    L, _ = _shape(model)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(L)]
    with torch.no_grad():
        _, cache = run_with_cache(model, input_ids=torch.tensor(ids[None]), names=names)
    weights = np.stack([cache[name][0].double().numpy() for name in names])  # (L, H, T, T)
    return all_head_scores(weights, [str(i) for i in ids], exclude_bos=True)
