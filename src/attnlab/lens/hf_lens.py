"""The lens on Hugging Face models, through attnlab's hook points (:mod:`attnlab.hf`).

A model loaded with ``attn_implementation="attnlab"`` (after :func:`attnlab.hf.register`)
exposes ``blocks.{l}.attn.hook_z`` (B, H, T, D: each head's output before W_O) and
``blocks.{l}.hook_resid_post`` (B, T, E); everything here edits or reads those points
with :func:`attnlab.lens.run_with_hooks` / :func:`~attnlab.lens.run_with_cache`:

- :func:`ablate_heads`: zero a head's z (equal to zeroing its columns of W_O, ``o_proj``)
  or replace it by its mean over the positions (mean ablation); returns the logits.
- :func:`ablation_effects`: (L, H) how much the output changes when each head alone is
  ablated: the relative change of the model's output tensor, or the drop of a metric.
- :func:`patch`: run the corrupted inputs with chosen heads' z (``hook_z``) or chosen
  layers' residual stream (``hook_resid_post``) taken from the clean run, at every
  position or at chosen ones (activation patching, Meng et al. 2022); :func:`patch_sweep`
  a metric of the output with each head patched alone, (L, H); :func:`path_patch` the
  corrupted run where one sender head's clean z reaches the output only through chosen
  receiver heads (Wang et al. 2022, as :func:`attnlab.lens.path_patch` defines it).
- :func:`head_importance`: |∂ metric / ∂ g_{l,h}| for a gate g multiplying each head's z,
  at g = 1, by torch autograd (Michel et al. 2019).
- :func:`logit_lens`: each layer's residual stream through the final norm and the
  unembedding (nostalgebraist 2020); at the last layer it is the model's own logits.
- :func:`direct_logit_attribution`: each head's contribution to one token's logit at
  one position: its z through its slice of W_O, the final norm's scale (frozen at the
  run's value: the norm made linear) and the unembedding.
- :func:`repeated_tokens_scores`: TransformerLens's previous-token, duplicate-token and
  induction scores on a random sequence repeated twice.

(B, H, T) legend: B batch, H heads, T tokens, D head dim, E model width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..messages import msg

__all__ = ["ablate_heads", "ablation_effects", "direct_logit_attribution", "final_norm_and_unembed",
           "head_importance", "logit_lens", "patch", "patch_sweep", "path_patch",
           "repeated_tokens_scores"]


def _heads(heads: Any, L: int, H: int, what: str = "heads") -> dict[int, list[int]]:
    """[(layer, head), ...] 0-based -> {layer: [heads]}, checked (``what``: the argument)."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise AttnlabError(f"{what}: expected a list of (layer, head) pairs, got {heads!r}")
    by_layer: dict[int, list[int]] = {}
    for item in heads:
        if not (isinstance(item, (tuple, list)) and len(item) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
                and 0 <= item[0] < L and 0 <= item[1] < H):
            raise AttnlabError(f"{what}: expected (layer, head) pairs with layer in [0, {L}) "
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


def ablation_effects(model: Any, metric: Callable[[Any], Any] | None = None, *,
                     how: str = "zero", **inputs: Any) -> np.ndarray:
    """(L, H): how much the output changes when each head alone is ablated
    (:func:`ablate_heads`; L·H runs and one plain run).

    Without ``metric``: ‖y_ablated − y‖ / ‖y‖, y the model's output tensor (``logits``
    of a language model, else ``last_hidden_state``: every batch item and position;
    0 = the head changes nothing). With ``metric`` (output -> a number): metric(plain)
    − metric(ablated), the metric's drop (negative where the ablation helps it).
    """
    import torch

    if metric is not None and not callable(metric):
        raise AttnlabError(f"metric: expected a function of the model's output, got {metric!r}")
    L, H = _shape(model)

    def read(output: Any) -> Any:
        if metric is not None:
            return float(metric(output))
        value = getattr(output, "logits", None)
        if value is None:
            value = getattr(output, "last_hidden_state", None)
        if value is None:
            value = output[0]
        return value.double()

    effects = np.empty((L, H))
    with torch.no_grad():
        plain = read(model(**inputs))
        for layer in range(L):
            for head in range(H):
                ablated = read(ablate_heads(model, [(layer, head)], how=how, **inputs))
                effects[layer, head] = (
                    plain - ablated if metric is not None
                    else float((ablated - plain).norm()) / max(float(plain.norm()), 1e-30))
    return effects


def patch(model: Any, clean: dict[str, Any], corrupted: dict[str, Any], *,
          heads: Sequence[tuple[int, int]] | None = None, layers: Sequence[int] | None = None,
          positions: Sequence[int] | None = None) -> Any:
    """The model's output on ``corrupted`` with activations from ``clean`` patched in.

    ``clean`` and ``corrupted`` are the model's keyword inputs (``{"input_ids": ...}``)
    of the same shape. Exactly one of ``heads`` [(layer, head), ...] (their
    ``blocks.{l}.attn.hook_z``, (B, H, T, D)) and ``layers`` [layer, ...] (their
    ``blocks.{l}.hook_resid_post``, (B, T, E)). ``positions``: the token positions
    patched (default all). Layers and heads are 0-based.
    """
    from . import run_with_cache, run_with_hooks

    _check_inputs(clean, corrupted)
    if (heads is None) == (layers is None):
        raise AttnlabError("heads, layers: expected exactly one of them (heads patch hook_z, "
                           f"layers hook_resid_post), got heads={heads!r}, layers={layers!r}")
    L, H = _shape(model)
    if heads is not None:
        by_layer = _heads(heads, L, H)
        names = [f"blocks.{layer}.attn.hook_z" for layer in by_layer]
    else:
        for layer in layers or []:
            if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < L:
                raise AttnlabError(f"layers: expected layers in [0, {L}), got {layer!r}")
        names = [f"blocks.{layer}.hook_resid_post" for layer in dict.fromkeys(layers or [])]
    if not names:
        raise AttnlabError("heads, layers: expected at least one to patch, got none")
    _, cache = run_with_cache(model, names=names, **clean)
    edit = _patcher(cache, by_layer if heads is not None else None, positions)
    return run_with_hooks(model, hooks=[(name, edit) for name in names], **corrupted)


def _check_inputs(clean: Any, corrupted: Any) -> None:
    for name, inputs in (("clean", clean), ("corrupted", corrupted)):
        if not isinstance(inputs, dict) or not inputs:
            raise AttnlabError(f"{name}: expected the model's keyword inputs as a dict "
                               f"(e.g. {{'input_ids': ids}}), got {inputs!r}")


def _where(positions: Sequence[int] | None, T: int) -> list[int]:
    """The checked token positions (all T when None)."""
    where = list(range(T)) if positions is None else list(positions)
    for position in where:
        if not isinstance(position, int) or isinstance(position, bool) \
                or not -T <= position < T:
            raise AttnlabError(f"positions: expected positions in [{-T}, {T}), "
                               f"got {position!r}")
    return where


def _same_shape(source: Any, value: Any, name: str) -> None:
    if tuple(source.shape) != tuple(value.shape):
        raise AttnlabError(f"corrupted: expected inputs of the clean run's shape ({name} "
                           f"{tuple(source.shape)}), got {tuple(value.shape)}")


def _patcher(cache: Any, by_layer: dict[int, list[int]] | None,
             positions: Sequence[int] | None) -> Callable[[Any, str], Any]:
    """The hook that writes the clean run's values (``cache``) into the corrupted run: the
    heads ``by_layer`` of hook_z, or (None) the whole hook_resid_post, at ``positions``."""

    def edit(value: Any, name: str) -> Any:
        source = cache[name]
        _same_shape(source, value, name)
        time_axis = 2 if name.endswith("hook_z") else 1  # (B, H, T, D) or (B, T, E)
        where = _where(positions, value.shape[time_axis])
        value = value.clone()
        index: list[Any] = [slice(None)] * value.dim()
        index[time_axis] = where
        if by_layer is not None:
            for head in by_layer[int(name.split(".")[1])]:
                index[1] = head
                value[tuple(index)] = source[tuple(index)].to(value.dtype)
        else:
            value[tuple(index)] = source[tuple(index)].to(value.dtype)
        return value

    return edit


def path_patch(model: Any, clean: dict[str, Any], corrupted: dict[str, Any], *,
               sender: tuple[int, int], receivers: Sequence[tuple[int, int]],
               positions: Sequence[int] | None = None) -> Any:
    """The model's output on ``corrupted`` when the ``sender`` head's z from ``clean``
    reaches it only through the ``receivers`` (path patching, Wang et al. 2022).

    The same two runs as :func:`attnlab.lens.path_patch` (attnlab's own models), on the
    hook points ``blocks.{l}.attn.hook_z`` (B, H, T, D):

    1. run ``corrupted`` with the sender's z taken from the clean run (at ``positions``,
       default all) and every other head's z frozen at its corrupted-run value, except
       the receivers', which are recomputed from the stream the sender changed; keep the
       receivers' z;
    2. run ``corrupted`` with only the receivers' z replaced by those of step 1 (at every
       position); its output is returned.

    What lies on the way (residual stream, norms, MLPs) is recomputed, as in
    TransformerLens. ``sender`` (layer, head) and ``receivers`` [(layer, head), ...] are
    0-based; every receiver sits in a layer after the sender's. ``clean`` and
    ``corrupted`` are the model's keyword inputs of the same shape.
    """
    import torch

    from . import run_with_cache, run_with_hooks

    _check_inputs(clean, corrupted)
    L, H = _shape(model)
    ((sender_layer, (sender_head,)),) = _heads([sender], L, H, "sender").items()
    receiving = _heads(receivers, L, H, "receivers")
    if not receiving:
        raise AttnlabError("receivers: expected at least one (layer, head), got none")
    early = [layer for layer in receiving if layer <= sender_layer]
    if early:
        raise AttnlabError(f"receivers: expected heads in layers after the sender's "
                           f"({sender_layer}), got one in layer {early[0]}")
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(max(receiving) + 1)]
    sender_name = names[sender_layer]
    with torch.no_grad():
        _, clean_cache = run_with_cache(model, names=[sender_name], **clean)
        _, corrupted_cache = run_with_cache(model, names=names, **corrupted)
    _same_shape(clean_cache[sender_name], corrupted_cache[sender_name], sender_name)
    where = _where(positions, corrupted_cache[sender_name].shape[2])
    received: dict[str, Any] = {}

    def sender_and_frozen(z: Any, name: str) -> Any:  # z: (B, H, T, D)
        layer = int(name.split(".")[1])
        patched = corrupted_cache[name].to(z.dtype).clone()  # every head frozen
        if layer == sender_layer:
            patched[:, sender_head, where] = clean_cache[name][:, sender_head, where].to(
                z.dtype)
        for head in receiving.get(layer, []):
            patched[:, head] = z[:, head]  # recomputed from the patched stream
        if layer in receiving:
            received[name] = z.detach().clone()
        return patched

    with torch.no_grad():
        run_with_hooks(model, hooks=[(name, sender_and_frozen) for name in names],
                       **corrupted)

    def receivers_only(z: Any, name: str) -> Any:  # z: (B, H, T, D)
        z = z.clone()
        for head in receiving[int(name.split(".")[1])]:
            z[:, head] = received[name][:, head].to(z.dtype)
        return z

    return run_with_hooks(model, hooks=[(f"blocks.{layer}.attn.hook_z", receivers_only)
                                        for layer in receiving], **corrupted)


def patch_sweep(model: Any, clean: dict[str, Any], corrupted: dict[str, Any],
                metric: Callable[[Any], Any], *,
                positions: Sequence[int] | None = None) -> np.ndarray:
    """(L, H): ``metric`` of the corrupted run's output with one head's z patched from the
    clean run, for every head (one clean run, L·H corrupted runs). ``metric`` maps the
    output to a number (a scalar tensor or a float), e.g. the logit difference of the
    right and the wrong answer at the last position."""
    import torch

    from . import run_with_cache, run_with_hooks

    _check_inputs(clean, corrupted)
    if not callable(metric):
        raise AttnlabError(f"metric: expected a function of the model's output, got {metric!r}")
    L, H = _shape(model)
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]
    scores = np.empty((L, H))
    with torch.no_grad():
        _, cache = run_with_cache(model, names=names, **clean)
        for layer in range(L):
            for head in range(H):
                edit = _patcher(cache, {layer: [head]}, positions)
                output = run_with_hooks(model, hooks=[(names[layer], edit)], **corrupted)
                scores[layer, head] = float(metric(output))
    return scores


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
        raise AttnlabError(msg("hf.lens_no_unembed", model=type(model).__name__))
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


def direct_logit_attribution(model: Any, *, token: int | None = None, position: int = -1,
                             **inputs: Any) -> tuple[np.ndarray, int]:
    """((L, H) each head's direct contribution to ``token``'s logit at ``position``, token).

    Batch item 0. Head h of layer l writes r = z_{l,h} W_O^h into the residual stream
    (its slice of the output projection, without the projection's bias). The final norm
    is made linear by freezing its scale at this run's value s = 1/√(mean x² + ε)
    (RMSNorm) or 1/√(var x + ε) after centring (LayerNorm; centring is linear too), x the
    final residual stream at ``position``; the contribution is (norm's weight · s · r) ·
    W_U[token]. Summed with the same terms for the embeddings, the MLPs and the biases it
    gives the logit (minus the unembedding's and the norm's bias). ``token``: default the
    model's top prediction at ``position``.
    """
    import torch

    from . import run_with_cache
    from .hf_points import attention_modules, output_projection

    L, H = _shape(model)
    norm, unembed = final_norm_and_unembed(model)
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(L)]
    names.append(f"blocks.{L - 1}.hook_resid_post")
    with torch.no_grad():
        output, cache = run_with_cache(model, names=names, **inputs)
        logits = output.logits[0]  # (T, V)
        T, V = logits.shape
        if not isinstance(position, int) or isinstance(position, bool) \
                or not -T <= position < T:
            raise AttnlabError(f"position: expected a position in [{-T}, {T}), "
                               f"got {position!r}")
        if token is None:
            token = int(logits[position].argmax())
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < V:
            raise AttnlabError(f"token: expected a token id in [0, {V}), got {token!r}")
        x = cache[f"blocks.{L - 1}.hook_resid_post"][0, position]  # (E,)
        centre = isinstance(norm, torch.nn.LayerNorm)
        eps = float(getattr(norm, "eps", None) or getattr(norm, "variance_epsilon", None) or 0.0)
        centred = x - x.mean() if centre else x
        scale = torch.rsqrt(centred.pow(2).mean() + eps)
        weight = getattr(norm, "weight", None)
        gain = weight if weight is not None else torch.ones_like(x)
        bias = getattr(norm, "bias", None)
        frozen = centred * scale * gain + (bias if bias is not None else 0.0)
        if not torch.allclose(frozen, norm(x[None])[0], rtol=1e-4, atol=1e-5):
            raise AttnlabError(msg("hf.dla_norm", norm=type(norm).__name__))
        direction = gain * scale * unembed.weight[token]  # (E,)
        scores = np.empty((L, H))
        for layer, attention in enumerate(attention_modules(model)):
            z = cache[f"blocks.{layer}.attn.hook_z"][0, :, position]  # (H, D)
            D = z.shape[-1]
            projection = output_projection(model, attention)
            stacked = z.new_zeros(H, H * D)  # row h: head h's z in its slice, 0 elsewhere
            for head in range(H):
                stacked[head, head * D:(head + 1) * D] = z[head]
            results = projection(stacked) - projection(z.new_zeros(1, H * D))  # (H, E)
            if centre:
                results = results - results.mean(dim=-1, keepdim=True)
            scores[layer] = (results @ direction).double().numpy()
    return scores, token


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
