"""Any Hugging Face model's attention, read for the viewer and the lens.

:func:`load_hf` opens a local Hugging Face folder (or a hub name, where the hub can be
reached) with the model's own tokenizer, never running code from the folder unless
``trust_remote_code=True``. :func:`run_hf` runs a text (a pair, or a prompt plus N
greedily generated tokens) and returns an :class:`HFRun`: the tokens and, for every
layer, what each head computed:

- ``weights`` (L, H, T, S): the attention weights, exactly what eager's
  ``output_attentions`` gives (the model's own eager function computes them);
- ``q`` (L, H, T, D), ``k`` (L, Hkv, S, D) and ``scales`` (L,): the queries and keys
  the weights came from (after RoPE, where there is RoPE), so that
  ``scores = q · kᵀ · scales[l]`` (+ −inf where not allowed) and ``weights = softmax(scores)``;
- ``value_norms`` (L, H, S): ‖v_j W_O^h‖ for each key j, so that ‖α_ij v_j W_O^h‖ =
  α_ij · value_norms[l, h, j] (Kobayashi et al. 2020).

How the reading is done: an attention function registered with transformers'
``AttentionInterface`` (with the eager mask function beside it in
``AttentionMaskInterface``, or transformers would pass no mask) records the query, key
and value it is given and calls the model's own ``eager_attention_forward``: nothing of
the model's computation is re-implemented. When attnlab's hook points reach Hugging
Face models (``blocks.{l}.attn.hook_q`` …), this reader becomes a ``run_with_cache``
over those names.

(B, H, T, S) legend: B batch, H query heads, Hkv key/value heads, T query length, S key
length, D head dim, E model width.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import AttnlabError
from ..messages import msg

__all__ = ["HFModel", "HFRun", "RECORDER", "load_hf", "output_projection", "record", "run_hf"]

#: The name of the recording attention function in transformers' registries.
RECORDER = "attnlab_record"


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
    scales: np.ndarray  # (L,): scores = q · kᵀ · scales[l]
    value_norms: np.ndarray  # (L, H, T)
    is_causal: bool
    prompt_length: int  # tokens before the generated ones (T when nothing was generated)
    segments: list[int] | None = None  # 0 = sentence A, 1 = sentence B (pairs only)
    logits: np.ndarray | None = field(default=None, repr=False)  # (T, vocab), decoders

    @property
    def generated(self) -> np.ndarray:
        return self.ids[self.prompt_length:]


def load_hf(name: str, *, trust_remote_code: bool = False, max_length: int | None = None,
            label: str | None = None, attn_implementation: str = "eager") -> HFModel:
    """A local Hugging Face folder (or hub name) as an :class:`HFModel`, float32, eval mode.

    Decoders (``*ForCausalLM`` architectures, or ``is_decoder``) load with their LM head;
    encoders without one. The tokenizer is the folder's own. A hub name that cannot be
    reached raises one :class:`~attnlab.errors.AttnlabError` line. ``label`` names the
    model in messages and titles (default: the folder's name). ``attn_implementation``:
    "eager" (the reader's default) or "attnlab" (after :func:`attnlab.hf.register`, for
    the hook points of :mod:`attnlab.lens.hf_lens`).
    """
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise AttnlabError(f"model: expected a Hugging Face folder or hub name, got {name!r}")
    try:
        import transformers
    except ImportError:
        raise AttnlabError("model: reading Hugging Face models needs transformers "
                           "(pip install 'attnlab[hf]')") from None
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


@dataclass
class _Call:
    module: Any
    query: Any  # (B, H, T, D)
    key: Any  # (B, Hkv, S, D)
    value: Any  # (B, Hkv, S, Dv)
    scale: float


_calls: list[_Call] | None = None


def _recording_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                         *args: Any, **kwargs: Any) -> Any:
    """Records (query, key, value) and calls the model's own eager attention."""
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if eager is None:
        raise AttnlabError(f"model: {type(module).__name__} has no eager_attention_forward "
                           "to read its weights from")
    scaling = kwargs.get("scaling")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if _calls is not None:
        _calls.append(_Call(module, query.detach(), key.detach(), value.detach(), scale))
    return eager(module, query, key, value, attention_mask, *args, **kwargs)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(RECORDER, _recording_attention)
    AttentionMaskInterface.register(RECORDER, eager_mask)


@contextmanager
def record(model: Any) -> Iterator[list[_Call]]:
    """Within the block, every attention call of ``model`` is recorded (in call order).

    The model runs the recording attention (the model's own eager function) and goes
    back to the implementation it had on exit, also after an exception.
    """
    global _calls
    _register()
    before = model.config._attn_implementation
    calls: list[_Call] = []
    model.set_attn_implementation(RECORDER)
    _calls = calls
    try:
        yield calls
    finally:
        _calls = None
        model.set_attn_implementation(before)


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


def _value_norms(model: Any, call: _Call, num_heads: int) -> np.ndarray:
    """‖v_j W_O^h‖ for every head h and key j: (H, S). W_O is applied as the model's own
    module to an input that holds v_j in head h's slice and zeros elsewhere, minus its
    bias (the module at zero), so Linear and GPT-2's Conv1D are read the same way."""
    import torch

    projection = output_projection(model, call.module)
    value = call.value[0]  # (Hkv, S, Dv)
    Hkv, S, Dv = value.shape
    value = value.repeat_interleave(num_heads // Hkv, dim=0)  # (H, S, Dv)
    norms = np.empty((num_heads, S))
    with torch.no_grad():
        zero = projection(value.new_zeros(1, num_heads * Dv))  # (1, E): the bias
        for h in range(num_heads):
            z = value.new_zeros(S, num_heads * Dv)
            z[:, h * Dv:(h + 1) * Dv] = value[h]
            norms[h] = (projection(z) - zero).norm(dim=-1).double().numpy()
    return norms


def run_hf(hf: HFModel, text: str, *, pair: str | None = None, generate: int = 0) -> HFRun:
    """Run ``text`` (and ``pair``, or ``generate`` greedy tokens after it) through ``hf``.

    With ``generate`` N > 0 (decoders only), ``model.generate`` picks N tokens greedily
    (the model's default cache, its own attention implementation); then one forward over
    prompt + generated tokens reads every head. For a causal model that forward's row t
    is exactly the row the cached step computed at position t (the KV cache grows by
    one key per step and changes no earlier row), so the viewer's step slider shows the
    cache growing by cutting this one matrix.
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
        with record(model) as calls:
            result = model(input_ids=ids, output_attentions=True, **extra)
    attentions = result.attentions
    if not attentions or len(calls) != len(attentions):
        raise AttnlabError(f"model: {type(model).__name__} did not pass its attention "
                           "through transformers' attention functions (cannot read it)")
    H = hf.num_heads
    weights = np.stack([a[0].double().numpy() for a in attentions])  # (L, H, T, T)
    q = np.stack([c.query[0].double().numpy() for c in calls])  # (L, H, T, D)
    k = np.stack([c.key[0].double().numpy() for c in calls])  # (L, Hkv, T, D)
    norms = np.stack([_value_norms(model, c, H) for c in calls])  # (L, H, T)
    flat = ids[0].tolist()
    tokens = [str(t) for t in hf.tokenizer.convert_ids_to_tokens(flat)]
    logits = result.logits[0].double().numpy() if hf.is_decoder else None
    return HFRun(tokens=tokens, ids=np.asarray(flat), weights=weights, q=q, k=k,
                 scales=np.array([c.scale for c in calls]), value_norms=norms,
                 is_causal=hf.is_decoder, prompt_length=prompt_length, segments=segments,
                 logits=logits)


def tokens_of(hf: HFModel, ids: Sequence[int]) -> list[str]:
    return [str(t) for t in hf.tokenizer.convert_ids_to_tokens(list(ids))]
