"""A BERT encoder built only from attnlab's own blocks, loaded from local files.

    embeddings = LN(word[ids] + position[0..T-1] + token_type[types])
    for each layer (post-LN, exact-erf GELU):
        h   = LN1(x + MHA(x, key_padding))
        x   = LN2(h + FFN(h))
    sentence = normalize(mean of x over real tokens)        # sentence-transformers

Weights are read with safetensors' NumPy API (never pickle) and text is
tokenised with the ``tokenizers`` library, from a directory holding
``config.json``, ``model.safetensors`` and ``tokenizer.json``. Every tensor's
name, shape and dtype is checked against the config before anything runs.

Dimension legend: B batch, L layers, H heads, T tokens, E hidden width,
F intermediate width, V vocabulary.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..attention import MAX_SCORE_ELEMENTS
from ..errors import AttnlabError, ShapeError, missing_extra, shape_str
from ..masks import padding_mask
from ..nn.layers import EncoderBlock, FeedForward, LayerNorm, layer_norm_inplace
from ..nn.multihead import MultiHeadAttention, linear
from ..special import gelu_erf
from ..trace import Recorder, Trace

__all__ = ["BertConfig", "BertModel", "load_bert", "ModelFileError", "REQUIRED_FILES"]

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")

_ACTIVATION = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
               "gelu_pytorch_tanh": "gelu_tanh"}


class ModelFileError(AttnlabError):
    """A model directory is missing a file, or holds a missing/extra/misshaped tensor."""


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the encoder uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config.json") -> BertConfig:
        if not isinstance(data, dict):
            raise ModelFileError(f"{source}: expected a JSON object of settings, got "
                                 f"{type(data).__name__} {_short(data)}")
        ints = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size")
        missing = [k for k in (*ints, "layer_norm_eps") if k not in data]
        if missing:
            raise ModelFileError(f"{source}: missing keys {missing}")
        for key in ints:
            if not _is_int(data[key]) or data[key] < 1:
                raise ModelFileError(f"{source}: {key} expected a positive integer, "
                                     f"got {_short(data[key])}")
        eps = data["layer_norm_eps"]
        if not (_is_int(eps) or isinstance(eps, float)) or not 0 < eps < math.inf:
            raise ModelFileError(f"{source}: layer_norm_eps expected a finite number > 0, "
                                 f"got {_short(eps)}")
        pad = data.get("pad_token_id", 0)
        if pad is None:  # some configs write null: no padding token declared
            pad = 0
        if not _is_int(pad) or not 0 <= pad < data["vocab_size"]:
            raise ModelFileError(f"{source}: pad_token_id expected an integer in "
                                 f"0..{data['vocab_size'] - 1} (vocab_size), got {_short(pad)}")
        if data["hidden_size"] % data["num_attention_heads"]:
            raise ModelFileError(
                f"{source}: hidden_size {data['hidden_size']} is not a multiple of "
                f"num_attention_heads {data['num_attention_heads']}"
            )
        act = data.get("hidden_act", "gelu")
        if not isinstance(act, str) or act not in _ACTIVATION:
            raise ModelFileError(f"{source}: hidden_act expected one of {sorted(_ACTIVATION)}, "
                                 f"got {act!r}")
        kind = data.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ModelFileError(f"{source}: position_embedding_type expected 'absolute', "
                                 f"got {kind!r}")
        return cls(**{k: data[k] for k in ints}, layer_norm_eps=float(eps),
                   hidden_act=act, pad_token_id=int(pad))

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every tensor the encoder needs (torch Linear layout: (out, in))."""
        E, F = self.hidden_size, self.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.word_embeddings.weight": (self.vocab_size, E),
            "embeddings.position_embeddings.weight": (self.max_position_embeddings, E),
            "embeddings.token_type_embeddings.weight": (self.type_vocab_size, E),
            "embeddings.LayerNorm.weight": (E,),
            "embeddings.LayerNorm.bias": (E,),
        }
        for i in range(self.num_hidden_layers):
            p = f"encoder.layer.{i}."
            for name in ("query", "key", "value"):
                shapes[p + f"attention.self.{name}.weight"] = (E, E)
                shapes[p + f"attention.self.{name}.bias"] = (E,)
            shapes[p + "attention.output.dense.weight"] = (E, E)
            shapes[p + "attention.output.dense.bias"] = (E,)
            shapes[p + "attention.output.LayerNorm.weight"] = (E,)
            shapes[p + "attention.output.LayerNorm.bias"] = (E,)
            shapes[p + "intermediate.dense.weight"] = (F, E)
            shapes[p + "intermediate.dense.bias"] = (F,)
            shapes[p + "output.dense.weight"] = (E, F)
            shapes[p + "output.dense.bias"] = (E,)
            shapes[p + "output.LayerNorm.weight"] = (E,)
            shapes[p + "output.LayerNorm.bias"] = (E,)
        return shapes


def _is_int(value: Any) -> bool:
    """A JSON integer (``true`` reads as a Python bool, which is an int: refused)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    """``repr(value)`` cut to one short line, for messages about a file's contents."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Tensors a checkpoint may carry that the encoder does not use.
_IGNORED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")

_LAYER = re.compile(r"encoder\.layer\.(\d+)\.")


def check_tensors(tensors: dict[str, np.ndarray], config: BertConfig, source: str) -> None:
    """Raise :class:`ModelFileError` on a missing, extra, misshaped or non-float tensor.

    The number of layers is compared first, from the tensor names alone: the
    list of expected tensors grows with the declared ``num_hidden_layers``, and a
    config declaring millions of layers must fail at once, not after a minute.
    """
    found = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    if config.num_hidden_layers > len(found):  # fewer are reported below, tensor by tensor
        raise ModelFileError(
            f"{source}: config.json declares num_hidden_layers = {config.num_hidden_layers}, "
            f"but the weights hold {len(found)} layers"
        )
    expected = config.expected_tensors()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected) - set(_IGNORED))
    problems = []
    if missing:
        problems.append(f"missing {len(missing)} tensors (first: {missing[:3]})")
    if extra:
        problems.append(f"unexpected {len(extra)} tensors (first: {extra[:3]})")
    for name, shape in expected.items():
        if name in tensors:
            arr = tensors[name]
            if tuple(arr.shape) != shape:
                problems.append(f"{name}: expected shape {shape_str(shape)}, "
                                f"got {shape_str(arr.shape)}")
            elif arr.dtype not in (np.float16, np.float32, np.float64):
                problems.append(f"{name}: expected a float dtype, got {arr.dtype}")
    if problems:
        raise ModelFileError(f"{source}: " + "; ".join(problems))


class BertModel:
    """A BERT encoder running on attnlab's NumPy attention.

    Shapes: ``forward(input_ids (B, T), attention_mask (B, T))`` -> hidden (B, T, E);
    ``encode(texts)`` -> (n, E) float32 sentence embeddings;
    ``run(text)`` -> a :class:`attnlab.Trace` with per-layer, per-head steps.
    """

    def __init__(
        self,
        config: BertConfig,
        tensors: dict[str, np.ndarray],
        tokenizer: Any,
        *,
        max_length: int = 512,
        name: str = "bert",
    ):
        check_tensors(tensors, config, name)
        if not 1 <= max_length <= config.max_position_embeddings:
            raise AttnlabError(f"max_length: expected 1..{config.max_position_embeddings}, "
                               f"got {max_length}")
        self.config, self.tokenizer, self.max_length, self.name = (
            config, tokenizer, max_length, name)
        t = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()
             if k not in _IGNORED}
        eps, H = config.layer_norm_eps, config.num_attention_heads
        E = config.hidden_size
        self.word_embeddings = t["embeddings.word_embeddings.weight"]  # (V, E)
        self.position_embeddings = t["embeddings.position_embeddings.weight"]  # (P, E)
        self.token_type_embeddings = t["embeddings.token_type_embeddings.weight"]  # (2, E)
        self.embedding_norm = LayerNorm(E, eps, gamma=t["embeddings.LayerNorm.weight"],
                                        beta=t["embeddings.LayerNorm.bias"])

        def dense(key: str) -> np.ndarray:
            """torch Linear stores (out, in); attnlab applies X @ W with W (in, out).

            Copied C-contiguous: sgemm runs ~2% faster on it than on the transposed view.
            """
            return np.ascontiguousarray(t[key].T)

        self.layers: list[EncoderBlock] = []
        for i in range(config.num_hidden_layers):
            p = f"encoder.layer.{i}."
            attn = MultiHeadAttention(
                Wq=dense(p + "attention.self.query.weight"), bq=t[p + "attention.self.query.bias"],
                Wk=dense(p + "attention.self.key.weight"), bk=t[p + "attention.self.key.bias"],
                Wv=dense(p + "attention.self.value.weight"), bv=t[p + "attention.self.value.bias"],
                Wo=dense(p + "attention.output.dense.weight"),
                bo=t[p + "attention.output.dense.bias"],
                num_heads=H,
            )
            norm1 = LayerNorm(E, eps, gamma=t[p + "attention.output.LayerNorm.weight"],
                              beta=t[p + "attention.output.LayerNorm.bias"])
            ffn = FeedForward.from_weights(
                dense(p + "intermediate.dense.weight"), t[p + "intermediate.dense.bias"],
                dense(p + "output.dense.weight"), t[p + "output.dense.bias"],
                activation=_ACTIVATION[config.hidden_act],
            )
            norm2 = LayerNorm(E, eps, gamma=t[p + "output.LayerNorm.weight"],
                              beta=t[p + "output.LayerNorm.bias"])
            self.layers.append(EncoderBlock.from_parts(attn, norm1, ffn, norm2, norm="post"))

    # ---- tokenising ------------------------------------------------------------

    def tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
        """Token ids (B, T) padded with pad_token_id, attention mask (B, T) of 0/1, tokens."""
        if isinstance(texts, str):
            raise AttnlabError("texts: expected a list of strings, got str")
        encodings = self.tokenizer.encode_batch(_text_list(texts))
        ids, real = self._pad([e.ids for e in encodings])
        return ids, real, [list(e.tokens) for e in encodings]

    def _pad(self, sequences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Token id lists -> ids (B, T) padded with pad_token_id, attention mask (B, T) of 0/1."""
        T = max((len(seq) for seq in sequences), default=0)
        ids = np.full((len(sequences), T), self.config.pad_token_id, dtype=np.int64)  # (B, T)
        real = np.zeros((len(sequences), T), dtype=np.int64)  # (B, T)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = seq
            real[row, : len(seq)] = 1
        return ids, real

    # ---- the encoder -----------------------------------------------------------

    def embed(self, input_ids: np.ndarray, token_type_ids: np.ndarray | None = None) -> np.ndarray:
        """(B, T) ids -> (B, T, E): word + position + token type, then LayerNorm."""
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ShapeError(f"input_ids: expected at most {self.config.max_position_embeddings} "
                             f"tokens, got {T}")
        if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise AttnlabError(f"input_ids: expected ids in [0, {self.config.vocab_size}), "
                               f"got [{input_ids.min()}, {input_ids.max()}]")
        x = self.word_embeddings[input_ids]  # (B, T, E), a new array: summed in place
        x += self.position_embeddings[:T]  # (B, T, E)
        x += (self.token_type_embeddings[0] if token_type_ids is None
              else self.token_type_embeddings[token_type_ids])  # (E,) or (B, T, E)
        norm = self.embedding_norm
        return layer_norm_inplace(x, norm.gamma, norm.beta, norm.eps)  # (B, T, E)

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        token_type_ids: np.ndarray | None = None,
        *,
        recorder: Recorder | None = None,
    ) -> np.ndarray:
        """Last hidden states (B, T, E). ``attention_mask`` 1 = real token (HF style)."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ShapeError(f"input_ids: expected integer (B, T), got {ids.dtype} "
                             f"{shape_str(ids.shape)}")
        # (B, 1, 1, T): True = a real key, may be attended; no padding needs no mask.
        mask = None if attention_mask is None else padding_mask(attention_mask)
        if mask is not None and (mask.shape[0], mask.shape[-1]) != ids.shape:
            raise ShapeError(f"attention_mask: expected {shape_str(ids.shape)} to match "
                             f"input_ids, got {shape_str((mask.shape[0], mask.shape[-1]))}")
        if mask is not None and mask.all():
            mask = None
        x = self.embed(ids, token_type_ids)  # (B, T, E)
        B, T = ids.shape
        if (recorder is None and 0 < B * self.config.num_attention_heads * T * T
                <= MAX_SCORE_ELEMENTS and all(_fusable(layer) for layer in self.layers)):
            hidden = fused_encoder(self.layers, x, mask)  # (B, T, E)
            if np.isfinite(hidden).all():
                return hidden
            # An overflow or a NaN on the way: the plain blocks say where, as they always have.
        if not self.layers:
            return x
        # One check of the mask for all layers (they share it), then the blocks unchecked.
        _, _, allowed, _, _ = self.layers[0].attn.check_call(x, None, mask)
        for i, layer in enumerate(self.layers):
            if recorder is not None:
                recorder.layer = i
            x = layer.forward(x, allowed, recorder=recorder)  # (B, T, E)
        return x

    def encode(self, texts: list[str], batch_size: int = 32, *,
               normalize: bool = True) -> np.ndarray:
        """Sentence embeddings (n, E) float32: mean over real tokens, then L2-normalised.

        Texts are tokenised once, sorted by their number of tokens and batched, so
        each batch is padded to the least possible length (sentence-transformers
        sorts by number of characters, a rougher guide: a Chinese character is
        about one token, an English word of five letters about one); the result
        is in the input order.
        """
        texts = [texts] if isinstance(texts, str) else _text_list(texts)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise AttnlabError(f"batch_size: expected a positive integer, got {batch_size!r}")
        sequences = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = np.argsort([-len(seq) for seq in sequences], kind="stable")
        out = np.zeros((len(texts), self.config.hidden_size), dtype=np.float32)  # (n, E)
        for start in range(0, len(texts), batch_size):
            chunk = order[start: start + batch_size]
            ids, real = self._pad([sequences[i] for i in chunk])  # (b, T), (b, T)
            hidden = self.forward(ids, real)  # (b, T, E)
            weights = real[..., None].astype(np.float32)  # (b, T, 1)
            summed = (hidden * weights).sum(axis=1)  # (b, E)
            pooled = summed / np.maximum(weights.sum(axis=1), 1e-9)  # (b, E)
            if normalize:
                norms = np.linalg.norm(pooled, axis=-1, keepdims=True)  # (b, 1)
                pooled = pooled / np.maximum(norms, 1e-12)
            out[chunk] = pooled
        return out

    def run(
        self,
        text: str,
        *,
        keep: str | tuple[str, ...] = ("weights",),
        layers: list[int] | None = None,
        heads: list[int] | None = None,
    ) -> Trace:
        """Trace one text through the model: per-layer, per-head steps.

        ``keep`` chooses the intermediates ("Q", "K", "V", "scores", "scaled",
        "weights", "output", "X", "projected", or "all"); ``layers``/``heads``
        restrict which are kept, so a long input need not hold every tensor.
        """
        if not isinstance(text, str):
            raise AttnlabError(f"text: expected a string, got {type(text).__name__}")
        for name, chosen, count in (("layers", layers, self.config.num_hidden_layers),
                                    ("heads", heads, self.config.num_attention_heads)):
            if chosen is not None and any(not 0 <= i < count for i in chosen):
                raise AttnlabError(f"{name}: expected indices in 0..{count - 1}, got {chosen}")
        recorder = Recorder(keep, layers=layers, heads=heads)
        ids, real, tokens = self.tokenize([text])
        hidden = self.forward(ids, real, recorder=recorder)  # (1, T, E)
        meta = {"model": self.name, "layers": self.config.num_hidden_layers,
                "heads": self.config.num_attention_heads, "T": len(tokens[0]),
                "hidden": hidden[0]}
        return Trace(steps=recorder.steps, tokens=tokens[0], meta=meta)

    def attentions(self, text: str) -> tuple[np.ndarray, list[str]]:
        """Attention weights of every layer and head (L, H, T, T), and the tokens."""
        trace = self.run(text)
        return trace.attention(), trace.tokens


def _text_list(texts: Any) -> list[str]:
    """``texts`` as a list of strings, or AttnlabError naming what was passed instead."""
    iterable = hasattr(texts, "__iter__") and not isinstance(texts, (str, bytes))
    items = list(texts) if iterable else None  # a generator is read once, here
    if items is None or not all(isinstance(t, str) for t in items):
        raise AttnlabError(f"texts: expected a list of strings, got {type(texts).__name__}")
    return items


def _fusable(block: EncoderBlock) -> bool:
    """Whether :func:`fused_encoder` computes exactly this block (as BertModel builds them)."""
    attn, ffn = block.attn, block.ffn
    arrays = (attn.Wq, attn.Wk, attn.Wv, attn.Wo, attn.bq, attn.bk, attn.bv, attn.bo,
              ffn.W1, ffn.b1, ffn.W2, ffn.b2,
              block.norm1.gamma, block.norm1.beta, block.norm2.gamma, block.norm2.beta)
    return (type(block) is EncoderBlock and block.norm == "post"
            and not (block.dropout.training and block.dropout.p > 0)
            and attn.rope is None and not attn.alibi and attn.num_kv_heads == attn.num_heads
            and attn.head_dim == attn.value_head_dim and ffn.activation == "gelu"
            and all(a is not None and a.dtype == np.float32 for a in arrays))


def fused_encoder(blocks: list[EncoderBlock], x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Post-LN BERT blocks with exact GELU on float32 x, in buffers reused by every block.

    Shapes: x (B, T, E) float32, mask bool (B, 1, 1, T) with True = a real key
    (may be attended), or None -> (B, T, E). Efficient implementation equivalent
    to the following (and tested against it), for blocks that :func:`_fusable`
    accepts::

        for block in blocks:
            x = block(x, mask)   # LN2(h + FFN(h)), h = LN1(x + MHA(x, mask))

    What changes is where results go and how rows are summed: one set of
    (B·T, E), (B·T, F) and (B, H, T, T) buffers for the whole stack instead of
    fresh arrays for every intermediate of every block (a fresh multi-megabyte
    array costs a page fault per 4 KiB the first time it is written), bias and
    GELU applied in place, LayerNorm's and the softmax's row sums as BLAS
    matrix-vector products (:func:`~attnlab.nn.layers.layer_norm_inplace`,
    :func:`softmax_by_blocks`), and no re-validation of already-checked arrays
    between blocks. The results agree with the blocks' to float32 rounding.
    """
    B, T, E = x.shape
    H = blocks[0].attn.num_heads
    D = E // H
    F = blocks[0].ffn.W1.shape[1]
    scale = np.float32(1.0 / math.sqrt(D))  # as scaled_dot_product_attention
    # Blocked keys get -inf before the softmax, as np.copyto(scores, -inf, where=~mask).
    key_bias = None if mask is None else np.where(mask, np.float32(0.0), np.float32(-np.inf))
    rows = np.array(x, dtype=np.float32).reshape(B * T, E)  # (N, E): the running hidden state
    q, k, v, heads, h = np.empty((5, B * T, E), dtype=np.float32)  # (N, E) each
    scores = np.empty((B, H, T, T), dtype=np.float32)  # (B, H, T, S), S = T
    hidden = np.empty((B * T, F), dtype=np.float32)  # (N, F)
    for block in blocks:
        attn, ffn = block.attn, block.ffn
        for out, w, b in ((q, attn.Wq, attn.bq), (k, attn.Wk, attn.bk), (v, attn.Wv, attn.bv)):
            linear(rows, w, b, out=out)  # (N, E)
        q_heads, k_heads, v_heads = (
            a.reshape(B, T, H, D).transpose(0, 2, 1, 3) for a in (q, k, v))  # (B, H, T, D)
        for exact in (False, True):
            np.matmul(q_heads, k_heads.transpose(0, 1, 3, 2), out=scores)  # (B, H, T, S)
            scores *= scale
            if key_bias is not None:
                scores += key_bias  # (B, H, T, S)
            if exact:  # rare: some row lies far below its block's maximum
                _softmax_last_axis(scores)  # (B, H, T, S) weights
            elif softmax_by_blocks(scores):
                break
        # weights @ V written straight into the merged-heads layout.
        np.matmul(scores, v_heads, out=heads.reshape(B, T, H, D).transpose(0, 2, 1, 3))
        linear(heads, attn.Wo, attn.bo, out=h)  # (N, E)
        h += rows  # residual; dropout is the identity in evaluation mode
        layer_norm_inplace(h, block.norm1.gamma, block.norm1.beta, block.norm1.eps)
        linear(h, ffn.W1, None, out=hidden)  # (N, F)
        gelu_erf(hidden, ffn.b1, out=hidden)  # GELU(h W1 + b1), in place
        linear(hidden, ffn.W2, ffn.b2, out=rows)  # (N, E); the block's input is spent
        rows += h  # residual
        layer_norm_inplace(rows, block.norm2.gamma, block.norm2.beta, block.norm2.eps)
    return rows.reshape(B, T, E)


#: A row whose exponentials (shifted by its block's maximum) sum to less than this
#: has its maximum more than ~46 below the block's: its smaller weights could
#: reach float32's subnormal range, so the row-by-row softmax is used instead.
_SMALLEST_ROW_SUM = 1e-20


def softmax_by_blocks(scores: np.ndarray) -> bool:
    """Softmax over the last axis in place, each row shifted by its (b, h) block's maximum.

    Shapes: scores (B, H, T, S). Softmax is unchanged by any constant shift of a
    row; one maximum per (T, S) block replaces T row maxima, and the row sums are
    one matrix-vector product: NumPy reductions and broadcasts over rows of S ~ 30
    cost ~5x more than a pass over the same data (the overhead is per row). A
    block whose keys are all masked (-inf) gives zeros, as the row-wise softmax.

    Returns False, with ``scores`` spoilt, if a row's maximum is so far below its
    block's that its small weights would lose precision: recompute the scores
    and use :func:`_softmax_last_axis`.
    """
    B, H, T, S = scores.shape
    top = scores.reshape(B * H, T * S).max(axis=1)  # (B·H,) block maxima
    dead = np.isneginf(top)  # (B·H,): every key masked
    top[dead] = 0.0  # avoid -inf - -inf
    scores -= top.reshape(B, H, 1, 1)
    np.exp(scores, out=scores)
    sums = scores.reshape(-1, S) @ np.ones(S, dtype=scores.dtype)  # (B·H·T,) row sums
    dead_rows = np.repeat(dead, T)  # (B·H·T,)
    if (sums[~dead_rows] < _SMALLEST_ROW_SUM).any():
        return False
    sums[dead_rows] = 1.0  # nothing to attend to: leave the zeros
    # Dividing by a (B, H, T, 1) array would again loop per row: expand it instead.
    scores *= np.repeat(1.0 / sums, S).reshape(B, H, T, S)
    return True


def _softmax_last_axis(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in place, as attnlab.attention's plain path.

    A row whose keys are all -inf (nothing to attend to) becomes zeros, not NaN.
    """
    row_max = np.max(scores, axis=-1, keepdims=True)  # (..., T, 1)
    row_max[np.isneginf(row_max)] = 0.0  # all-masked row: avoid -inf - -inf
    scores -= row_max
    np.exp(scores, out=scores)
    sums = np.sum(scores, axis=-1, keepdims=True)  # (..., T, 1)
    sums[sums == 0.0] = 1.0  # nothing to attend to: leave the zeros
    scores /= sums
    return scores


def load_bert(
    path: str | Path, *, max_length: int | None = None, name: str | None = None
) -> BertModel:
    """Build a :class:`BertModel` from a local directory.

    The directory must hold ``config.json``, ``model.safetensors`` and
    ``tokenizer.json``. ``max_length`` (tokens, truncating longer input) defaults
    to ``max_seq_length`` from ``sentence_bert_config.json`` when present (256
    for all-MiniLM-L6-v2), else the model's max_position_embeddings.
    """
    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError:
        raise missing_extra("safetensors and tokenizers", "models", "Loading a model") from None
    folder = Path(path)
    if not folder.is_dir():
        raise ModelFileError(f"path: expected a model directory, got {str(path)!r}")
    missing = [f for f in REQUIRED_FILES if not (folder / f).is_file()]
    if missing:
        raise ModelFileError(f"path: {folder.name} is missing {', '.join(missing)} "
                             f"(a BERT directory needs {', '.join(REQUIRED_FILES)})")
    config = BertConfig.from_dict(_read_json(folder / "config.json"))
    if max_length is None:
        st_config = folder / "sentence_bert_config.json"
        max_length = config.max_position_embeddings
        if st_config.is_file():
            st_data = _read_json(st_config)
            if not isinstance(st_data, dict):
                raise ModelFileError(f"{st_config.name}: expected a JSON object of settings, "
                                     f"got {type(st_data).__name__} {_short(st_data)}")
            max_length = st_data.get("max_seq_length", max_length)
            if not _is_int(max_length) or not 1 <= max_length <= config.max_position_embeddings:
                raise ModelFileError(
                    f"{st_config.name}: max_seq_length expected an integer in "
                    f"1..{config.max_position_embeddings} (max_position_embeddings), "
                    f"got {_short(max_length)}"
                )
    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except Exception as exc:  # safetensors raises its own error types on a bad header
        raise ModelFileError(f"model.safetensors: could not be read ({exc})") from None
    # Checkpoints saved from a BertFor... model prefix the encoder with "bert." and
    # add their task head ("cls.", "classifier."), which the encoder does not use.
    if any(k.startswith("bert.") for k in tensors):
        tensors = {k.removeprefix("bert."): v for k, v in tensors.items()
                   if k.startswith("bert.")}
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises its own error types on a bad file
        raise ModelFileError(f"tokenizer.json: could not be read ({_short(str(exc))})") from None
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return BertModel(config, tensors, tokenizer, max_length=max_length,
                     name=name or folder.name)


def _read_json(path: Path) -> Any:
    """A model directory's JSON file, or a :class:`ModelFileError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path.name}: not valid UTF-8 ({exc.reason} at byte "
                             f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path.name}: not valid JSON ({exc})") from None
