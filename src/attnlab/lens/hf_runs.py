"""Any Hugging Face model's attention, read for the viewer and the lens.

:func:`load_hf` opens a local Hugging Face folder (or a hub name, where the hub can be
reached) with the model's own tokenizer, never running code from the folder unless
``trust_remote_code=True``. :func:`run_hf` runs a text (a pair, or a prompt plus N
greedily generated tokens) and returns an :class:`HFRun`: the tokens and, for every
layer, what each head computed:

- ``weights`` (L, H, T, S): the attention weights (``hook_pattern``), what eager's
  ``output_attentions`` gives up to float32 rounding;
- ``q`` (L, H, T, D), ``k`` (L, Hkv, S, D) (``hook_q``, ``hook_k``) and ``scales`` (L,):
  the queries and keys the weights came from (after RoPE, where there is RoPE), so
  that ``scores = q · kᵀ · scales[l]`` (+ −inf where not allowed) and
  ``weights = softmax(scores)``. The scale is the attention module's ``scaling`` (what
  transformers passes to the attention function), or where a module has none the
  least-squares fit of the scores; either way it is checked against the scores the
  model computed (``hook_attn_scores``). Where they are not q·kᵀ × one scale (a soft
  cap, as in Gemma 2; a bias such as ALiBi), ``scales`` is None and ``neuron_note``
  says why: the neuron view, which shows q·k × scale as the score, is left out;
- ``value_norms`` (L, H, S): ‖v_j W_O^h‖ for each key j (v from ``hook_v``), so
  that ‖α_ij v_j W_O^h‖ = α_ij · value_norms[l, h, j] (Kobayashi et al. 2020);
- ``ablation`` (L, H), when asked for: how much the model's output changes when each
  head alone is zero-ablated, ‖y_ablated − y‖ / ‖y‖
  (:func:`attnlab.lens.hf_lens.ablation_effects`; L·H more runs).

How the reading is done: the model runs on attnlab's attention implementation
(``attn_implementation="attnlab"``, registered by :func:`attnlab.hf.register`) and
:func:`attnlab.lens.run_with_cache` reads its hook points ``blocks.{l}.attn.hook_q``,
``hook_k``, ``hook_v`` and ``hook_pattern`` (:mod:`attnlab.lens.hf_points`): the one
hook system, nothing recorded on the side and nothing of the model re-implemented.
The weights are attnlab's plain-path softmax of the scores, which equals transformers'
eager ``output_attentions`` to float32 rounding (tests/models/test_hf_runs.py).

(B, H, T, S) legend: B batch, H query heads, Hkv key/value heads, T query length, S key
length, D head dim, E model width.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..messages import Message, msg
from .cache import run_with_cache
from .hf_points import attention_modules, output_projection

__all__ = ["HFModel", "HFRun", "load_hf", "output_projection", "run_hf", "score_scales"]

#: The attention points :func:`run_hf` reads, per layer.
READ_POINTS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern")


@dataclass
class HFModel:
    """A Hugging Face model in eval mode, its tokenizer, and whether it is a decoder."""

    model: Any
    tokenizer: Any
    name: str
    is_decoder: bool

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.model.config.num_attention_heads)

    @property
    def num_kv_heads(self) -> int:
        return int(getattr(self.model.config, "num_key_value_heads", None) or self.num_heads)


@dataclass
class HFRun:
    """What :func:`run_hf` read (NumPy, float64 except the ids)."""

    tokens: list[str]
    ids: np.ndarray  # (T,)
    weights: np.ndarray  # (L, H, T, T)
    q: np.ndarray  # (L, H, T, D)
    k: np.ndarray  # (L, Hkv, T, D)
    scales: np.ndarray | None  # (L,): scores = q · kᵀ · scales[l]; None: they are not
    value_norms: np.ndarray  # (L, H, T)
    is_causal: bool
    prompt_length: int  # tokens before the generated ones (T when nothing was generated)
    segments: list[int] | None = None  # 0 = sentence A, 1 = sentence B (pairs only)
    logits: np.ndarray | None = field(default=None, repr=False)  # (T, vocab), decoders
    ablation: np.ndarray | None = None  # (L, H): relative output change, each head zeroed
    neuron_note: Message | None = None  # why scales is None (no neuron view)

    @property
    def generated(self) -> np.ndarray:
        return self.ids[self.prompt_length:]


def load_hf(name: str, *, trust_remote_code: bool = False, max_length: int | None = None,
            label: str | None = None, attn_implementation: str = "attnlab") -> HFModel:
    """A local Hugging Face folder (or hub name) as an :class:`HFModel`, float32, eval mode.

    Decoders (``*ForCausalLM`` architectures, or ``is_decoder``) load with their LM head;
    encoders without one. The tokenizer is the folder's own. A hub name that cannot be
    reached raises one :class:`~attnlab.errors.AttnlabError` line. ``label`` names the
    model in messages and titles (default: the folder's name). ``attn_implementation``:
    "attnlab" (the default, registered by :func:`attnlab.hf.register` beforehand: the
    hook points that :func:`run_hf` and :mod:`attnlab.lens.hf_lens` read) or any of
    transformers' own ("eager", "sdpa"; no attention hook points then).
    """
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise AttnlabError(f"model: expected a Hugging Face folder or hub name, got {name!r}")
    try:
        import transformers
    except ImportError:
        raise AttnlabError("model: reading Hugging Face models needs transformers "
                           "(pip install 'attnlab[hf]')") from None
    if (attn_implementation not in ("eager", "sdpa")
            and attn_implementation not in transformers.AttentionInterface._global_mapping):
        raise AttnlabError(
            f"attn_implementation: expected 'eager', 'sdpa' or a name registered with "
            f"transformers (call attnlab.hf.register() for 'attnlab'), got "
            f"{attn_implementation!r}")
    source = str(name)
    local = Path(source).is_dir()
    if not local and (Path(source).exists() or source.startswith((".", "/", "~"))):
        raise AttnlabError(msg("hf.not_a_folder", name="model", got=repr(source)))
    try:
        config = transformers.AutoConfig.from_pretrained(
            source, trust_remote_code=trust_remote_code)
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            source, trust_remote_code=trust_remote_code)
        architectures = list(getattr(config, "architectures", None) or [])
        is_decoder = bool(getattr(config, "is_decoder", False)) or any(
            a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
        auto = transformers.AutoModelForCausalLM if is_decoder else transformers.AutoModel
        model = auto.from_pretrained(source, attn_implementation=attn_implementation,
                                     trust_remote_code=trust_remote_code,
                                     dtype="float32")
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not local:
            raise AttnlabError(msg("hf.hub_unreachable", name="model", got=repr(source),
                                   detail=first)) from None
        raise AttnlabError(msg("hf.folder_unreadable", name="model", got=repr(source),
                               detail=first)) from None
    model.eval()
    if max_length is not None:
        tokenizer.model_max_length = max_length
    return HFModel(model=model, tokenizer=tokenizer, name=label or Path(source).name or source,
                   is_decoder=is_decoder)


def _value_norms(model: Any, attention: Any, value: Any, num_heads: int) -> np.ndarray:
    """‖v_j W_O^h‖ for every head h and key j: (H, S), from ``value`` (B, Hkv, S, Dv) as
    ``hook_v`` read it. W_O is applied as the model's own module to an input that holds
    v_j in head h's slice and zeros elsewhere, minus its bias (the module at zero), so
    Linear and GPT-2's Conv1D are read the same way."""
    import torch

    from ..torch.gqa import repeat_kv

    projection = output_projection(model, attention)
    value = value[0]  # (Hkv, S, Dv)
    Hkv, S, Dv = value.shape
    value = repeat_kv(value, num_heads // Hkv)  # (H, S, Dv)
    norms = np.empty((num_heads, S))
    with torch.no_grad():
        zero = projection(value.new_zeros(1, num_heads * Dv))  # (1, E): the bias
        for h in range(num_heads):
            z = value.new_zeros(S, num_heads * Dv)
            z[:, h * Dv:(h + 1) * Dv] = value[h]
            norms[h] = (projection(z) - zero).norm(dim=-1).double().numpy()
    return norms


def score_scales(hf: HFModel, attentions: Sequence[Any], q: np.ndarray, k: np.ndarray,
                 scores: np.ndarray, weights: np.ndarray
                 ) -> tuple[np.ndarray | None, Message | None]:
    """(L,) the scale s_l with scores = q · kᵀ · s_l, checked against the ``scores`` the
    model computed, or (None, why) where they are not that.

    q (L, H, T, D), k (L, Hkv, S, D), scores and weights (L, H, T, S) of batch item 0.
    The scale is the module's ``scaling`` or, where it has none, the least-squares fit
    over the taken positions (weight > 0: masked ones hold −inf or the dtype's minimum).
    A module with a soft cap (``attn_logit_softcapping``, Gemma 2) is refused by name;
    any other difference above float32 rounding (1e-4 of the largest |score|) too.
    """
    config = hf.model.config
    H, Hkv = q.shape[1], k.shape[1]
    found = []
    for layer, attention in enumerate(attentions):
        cap = (getattr(attention, "attn_logit_softcapping", None)
               or getattr(config, "attn_logit_softcapping", None))
        if cap:
            return None, msg("hf.neuron_softcap", model=hf.name, layer=layer + 1, cap=cap)
        dots = np.einsum("htd,hsd->hts", q[layer],
                         np.repeat(k[layer], H // Hkv, axis=0))  # (H, T, S)
        taken = (weights[layer] > 0) & np.isfinite(scores[layer])  # (H, T, S)
        dot, score = dots[taken], scores[layer][taken]
        scale = getattr(attention, "scaling", None)
        if scale is None:
            scale = float(dot @ score / max(float(dot @ dot), 1e-300))
        error = float(np.abs(dot * float(scale) - score).max(initial=0.0))
        if error > 1e-4 * (1.0 + float(np.abs(score).max(initial=0.0))):
            return None, msg("hf.neuron_scale", model=hf.name, layer=layer + 1,
                             error=f"{error:.3g}")
        found.append(float(scale))
    return np.array(found), None


def run_hf(hf: HFModel, text: str, *, pair: str | None = None, generate: int = 0,
           ablation: bool = False) -> HFRun:
    """Run ``text`` (and ``pair``, or ``generate`` greedy tokens after it) through ``hf``.

    With ``generate`` N > 0 (decoders only), ``model.generate`` picks N tokens greedily
    (the model's default cache, its own attention implementation); then one forward over
    prompt + generated tokens reads every head. For a causal model that forward's row t
    is exactly the row the cached step computed at position t (the KV cache grows by
    one key per step and changes no earlier row), so the viewer's step slider shows the
    cache growing by cutting this one matrix. ``ablation``: also measure each head's
    zero-ablation effect on the output over the same tokens (``HFRun.ablation``).
    """
    import torch

    if not isinstance(text, str) or not text.strip():
        raise AttnlabError(f"text: expected some text, got {text!r}")
    if pair is not None and (not isinstance(pair, str) or not pair.strip()):
        raise AttnlabError(f"pair: expected some text, got {pair!r}")
    if not isinstance(generate, int) or isinstance(generate, bool) or generate < 0:
        raise AttnlabError(f"generate: expected a number of tokens >= 0, got {generate!r}")
    if generate and not hf.is_decoder:
        raise AttnlabError(msg("hf.encoder_generate", name="generate", model=hf.name))
    if generate and pair is not None:
        raise AttnlabError("pair: expected no pair together with generate")
    encoded = hf.tokenizer(text, pair, return_tensors="pt", truncation=True)
    ids = encoded["input_ids"]  # (1, T)
    segments = None
    if pair is not None:
        sequence = encoded.sequence_ids(0) if hasattr(encoded, "sequence_ids") else None
        if sequence is None:
            raise AttnlabError("pair: this tokenizer cannot tell the two texts apart")
        segments = [0 if s is None and i == 0 else (1 if s == 1 else 0)
                    for i, s in enumerate(sequence)]
        # A special token after sentence A's end belongs to A, after B's to B.
        for i in range(1, len(segments)):
            if sequence[i] is None:
                segments[i] = segments[i - 1]
    prompt_length = int(ids.shape[1])
    model = hf.model
    with torch.no_grad():
        if generate:
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=generate, do_sample=False,
                                 pad_token_id=hf.tokenizer.pad_token_id or 0)
            ids = out[:, : prompt_length + generate]
        # Segment embeddings only where the model has them (BERT); GPT-2 would add its
        # token embedding of the segment id instead.
        extra = ({"token_type_ids": encoded["token_type_ids"]}
                 if pair is not None and "token_type_ids" in encoded
                 and bool(getattr(model.config, "type_vocab_size", None)) else {})
        names = [f"blocks.{layer}.attn.{point}" for layer in range(hf.num_layers)
                 for point in READ_POINTS]
        result, cache = run_with_cache(model, input_ids=ids, names=names, **extra)
    attentions = attention_modules(model)
    H, L = hf.num_heads, hf.num_layers
    missing = [name for name in names if name not in cache]
    if missing:
        raise AttnlabError(f"model: {type(model).__name__} did not pass its attention "
                           f"through transformers' attention functions (no {missing[0]})")

    def read(layer: int, point: str) -> Any:
        return cache[f"blocks.{layer}.attn.{point}"]

    weights = np.stack([read(i, "hook_pattern")[0].double().numpy()
                        for i in range(L)])  # (L, H, T, T)
    q = np.stack([read(i, "hook_q")[0].double().numpy() for i in range(L)])  # (L, H, T, D)
    k = np.stack([read(i, "hook_k")[0].double().numpy() for i in range(L)])  # (L, Hkv, T, D)
    norms = np.stack([_value_norms(model, attentions[i], read(i, "hook_v"), H)
                      for i in range(L)])  # (L, H, T)
    scores = np.stack([read(i, "hook_attn_scores")[0].double().numpy()
                       for i in range(L)])  # (L, H, T, T)
    scales, neuron_note = score_scales(hf, attentions, q, k, scores, weights)
    flat = ids[0].tolist()
    tokens = [str(t) for t in hf.tokenizer.convert_ids_to_tokens(flat)]
    logits = result.logits[0].double().numpy() if hf.is_decoder else None
    effects = None
    if ablation:
        from .hf_lens import ablation_effects

        effects = ablation_effects(model, input_ids=ids, **extra)  # (L, H)
    return HFRun(tokens=tokens, ids=np.asarray(flat), weights=weights, q=q, k=k,
                 scales=scales, value_norms=norms,
                 is_causal=hf.is_decoder, prompt_length=prompt_length, segments=segments,
                 logits=logits, ablation=effects, neuron_note=neuron_note)


def tokens_of(hf: HFModel, ids: Sequence[int]) -> list[str]:
    return [str(t) for t in hf.tokenizer.convert_ids_to_tokens(list(ids))]
