"""A BERT encoder built only from attnlab's own blocks, loaded from local files.

    embeddings = LN(word[ids] + position[0..T-1] + token_type[types])
    for each layer (post-LN, exact-erf GELU):
        h   = LN1(x + MHA(x, key_padding))
        x   = LN2(h + FFN(h))
    sentence = normalize(mean of x over real tokens)        # sentence-transformers

The model is built by :func:`attnlab.models.loading.load_bert` from a local
directory; its configuration and weight checks live in
:mod:`attnlab.models.config`, and the fast path of :meth:`BertModel.forward` in
:mod:`attnlab.models.fused`.

Dimension legend: B batch, L layers, H heads, T tokens, E hidden width,
F intermediate width, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..attention import MAX_SCORE_ELEMENTS
from ..checks import check_flag, check_text, shape_str
from ..errors import AttnlabError, ShapeError
from ..fast.varlen import check_cu_seqlens
from ..hooks import HookSite, any_attached
from ..masks import padding_mask
from ..messages import msg
from ..nn.layers import EncoderBlock, FeedForward, LayerNorm, layer_norm_inplace
from ..nn.multihead import MultiHeadAttention
from ..trace import Recorder, Trace
from .config import ACTIVATION, IGNORED_TENSORS, BertConfig, check_tensors
from .fused import fusable, fused_encoder, fused_encoder_packed

__all__ = ["BertModel", "check_max_length"]


class BertModel:
    """A BERT encoder running on attnlab's NumPy attention.

    Shapes: ``forward(input_ids (B, T), attention_mask (B, T))`` -> hidden (B, T, E);
    ``forward_packed(input_ids (N,), cu_seqlens (B + 1,))`` -> hidden (N, E);
    ``encode(texts)`` -> (n, E) float32 sentence embeddings;
    ``run(text)`` -> a :class:`attnlab.Trace` with per-layer, per-head steps.

    Hook points (:mod:`attnlab.hooks`): ``hook_embed``, ``hook_pos_embed``,
    ``hook_token_type_embed`` (B, T, E), then ``blocks.{l}.*`` of each
    :class:`attnlab.EncoderBlock`. ``fused`` (default True) chooses the fused float32
    encoder of :mod:`attnlab.models.fused` whenever it computes exactly what the
    blocks compute (:func:`~attnlab.models.fused.fusable`), no recorder is given and
    no hook is attached; otherwise (or with ``fused = False``) the blocks run one by
    one, which is the path hooks see.
    """

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)
    #: Use the fused float32 encoder where it applies (see the class docstring).
    fused: bool = True

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
        self.config, self.tokenizer, self.name = config, tokenizer, name
        self.max_length = max_length  # checked, and handed to the tokenizer
        t = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in tensors.items()
             if k not in IGNORED_TENSORS}
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
                activation=ACTIVATION[config.hidden_act],
            )
            norm2 = LayerNorm(E, eps, gamma=t[p + "output.LayerNorm.weight"],
                              beta=t[p + "output.LayerNorm.bias"])
            self.layers.append(EncoderBlock.from_parts(attn, norm1, ffn, norm2, norm="post"))

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The embeddings' points, then every block's under ``blocks.{l}``."""
        return ["hook_embed", "hook_pos_embed", "hook_token_type_embed",
                *((f"blocks.{i}", layer) for i, layer in enumerate(self.layers))]

    # ---- tokenising ------------------------------------------------------------

    @property
    def max_length(self) -> int:
        """Tokens kept per text (longer input is truncated); settable at any time."""
        return self._max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max_length = check_max_length(value, self.config)
        if self.tokenizer is not None:  # the tokenizer is what truncates
            self.tokenizer.enable_truncation(max_length=self._max_length)

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

    def _check_vocab(self, input_ids: np.ndarray) -> None:
        """Refuse token ids outside [0, vocab_size), naming the range received."""
        if input_ids.size and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise AttnlabError(f"input_ids: expected ids in [0, {self.config.vocab_size}), "
                               f"got [{input_ids.min()}, {input_ids.max()}]")

    def embed(self, input_ids: np.ndarray, token_type_ids: np.ndarray | None = None) -> np.ndarray:
        """(B, T) ids -> (B, T, E): word + position + token type, then LayerNorm."""
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ShapeError(f"input_ids: expected at most {self.config.max_position_embeddings} "
                             f"tokens, got {T}")
        self._check_vocab(input_ids)
        site = self.hook_site
        x = self.word_embeddings[input_ids]  # (B, T, E), a new array: summed in place
        types = (self.token_type_embeddings[0] if token_type_ids is None
                 else self.token_type_embeddings[token_type_ids])  # (E,) or (B, T, E)
        if site is None:
            x += self.position_embeddings[:T]  # (B, T, E)
            x += types
        else:
            shape = x.shape
            x = site("hook_embed", x)  # (B, T, E)
            positions = site("hook_pos_embed", np.broadcast_to(
                self.position_embeddings[:T], shape).copy())  # (B, T, E)
            kinds = site("hook_token_type_embed", np.broadcast_to(types, shape).copy())
            x = np.ascontiguousarray(x + positions + kinds)  # (B, T, E)
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
        if (self.fused and recorder is None and 0 < B * self.config.num_attention_heads * T * T
                <= MAX_SCORE_ELEMENTS and all(fusable(layer) for layer in self.layers)
                and not any_attached(self)):
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

    def forward_packed(self, input_ids: Any, cu_seqlens: Any) -> np.ndarray:
        """Last hidden states (N, E) of B sequences packed one after another, without padding.

        Shapes: input_ids (N,) integer, the sequences' token ids concatenated;
        cu_seqlens (B + 1,) int, sequence b = ids[cu_seqlens[b] : cu_seqlens[b + 1]]
        (FlashAttention's varlen layout, see :mod:`attnlab.fast.varlen`) -> (N, E).

        Each sequence is encoded as if alone: its positions start at 0 and its
        tokens attend only to each other. Equals ``forward`` of the padded batch
        at the real tokens (to float32 rounding), without computing any padding.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ShapeError(f"input_ids: expected integer (N,) packed token ids, got "
                             f"{ids.dtype} {shape_str(ids.shape)}")
        cu = check_cu_seqlens(cu_seqlens, "cu_seqlens", ids.shape[0], "input_ids.shape[0]")
        lengths = np.diff(cu)  # (B,)
        longest = int(lengths.max()) if lengths.size else 0
        if longest > self.config.max_position_embeddings:
            raise ShapeError(f"cu_seqlens: expected sequences of at most "
                             f"{self.config.max_position_embeddings} tokens, got {longest}")
        self._check_vocab(ids)
        positions = np.arange(ids.shape[0]) - np.repeat(cu[:-1], lengths)  # (N,) from 0 each
        x = self.word_embeddings[ids]  # (N, E), a new array: summed in place
        x += self.position_embeddings[positions]  # (N, E)
        x += self.token_type_embeddings[0]  # (E,)
        norm = self.embedding_norm
        x = layer_norm_inplace(x, norm.gamma, norm.beta, norm.eps)  # (N, E)
        if self.fused and ids.size and all(fusable(layer) for layer in self.layers) and (
                not any_attached(self)):
            hidden = fused_encoder_packed(self.layers, x, cu)  # (N, E)
            if np.isfinite(hidden).all():
                return hidden
            # An overflow or a NaN on the way: the plain blocks say where.
        # The plain twin: each sequence alone through the blocks, checked once per sequence.
        for b in range(lengths.size):
            rows = slice(int(cu[b]), int(cu[b + 1]))
            seq = x[None, rows]  # (1, T_b, E)
            for layer in self.layers:
                seq = layer(seq)  # (1, T_b, E)
            x[rows] = seq[0]
        return x

    def encode(self, texts: list[str], batch_size: int = 32, *,
               normalize: bool = True, pack: bool = True) -> np.ndarray:
        """Sentence embeddings (n, E) float32: mean over real tokens, then L2-normalised.

        Texts are tokenised once, sorted by their number of tokens and batched
        (sentence-transformers sorts by number of characters, a rougher guide: a
        Chinese character is about one token, an English word of five letters
        about one); the result is in the input order.

        ``pack=True`` (the default) packs each batch's sequences one after another
        without padding (:meth:`forward_packed`): no work is spent on padding
        tokens. ``pack=False`` pads each batch to its longest member and masks
        the padding (:meth:`forward`), as sentence-transformers does; both give
        the same embeddings to float32 rounding.
        """
        texts = [check_text(texts, "texts")] if isinstance(texts, str) else _text_list(texts)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise AttnlabError(f"batch_size: expected a positive integer, got {batch_size!r}")
        pack = check_flag(pack, "pack")
        sequences = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = np.argsort([-len(seq) for seq in sequences], kind="stable")
        out = np.zeros((len(texts), self.config.hidden_size), dtype=np.float32)  # (n, E)
        for start in range(0, len(texts), batch_size):
            chunk = order[start: start + batch_size]
            if pack:
                pooled = self._encode_packed([sequences[i] for i in chunk])  # (b, E)
            else:
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

    def _encode_packed(self, sequences: list[list[int]]) -> np.ndarray:
        """Mean-pooled hidden states (b, E) of token id lists, packed without padding."""
        lengths = np.array([len(seq) for seq in sequences], dtype=np.int64)  # (b,)
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (b + 1,)
        ids = np.fromiter((i for seq in sequences for i in seq), dtype=np.int64,
                          count=int(cu[-1]))  # (N,)
        hidden = self.forward_packed(ids, cu)  # (N, E)
        pooled = np.zeros((len(sequences), hidden.shape[1]), dtype=np.float32)  # (b, E)
        real = lengths > 0  # a tokenizer without special tokens can give an empty text
        pooled[real] = np.add.reduceat(hidden, cu[:-1][real], axis=0)  # (b', E) row sums
        return pooled / np.maximum(lengths, 1)[:, None].astype(np.float32)  # (b, E)

    def encode_pair(self, text: str, text_pair: str | None = None
                    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """One text, or a sentence pair, as the model reads it: ids (1, T), token-type
        ids (1, T) (0 for ``[CLS] text [SEP]``, 1 for ``text_pair [SEP]``) and tokens.

        A literal ``[SEP]`` inside ``text`` (``"A [SEP] B"``, with no ``text_pair``)
        is read as the pair ("A", "B"), token types and all: the tokenizer would
        otherwise make it the separator token with every type 0, which no pair
        trained model ever saw. More than one is refused.
        """
        if not isinstance(text, str):
            raise AttnlabError(f"text: expected a string, got {type(text).__name__}")
        sep = "[SEP]"
        if text_pair is None and sep in text and self.tokenizer.token_to_id(sep) is not None:
            if text.count(sep) > 1:
                raise AttnlabError(f"text: expected at most one {sep} (a sentence pair), got "
                                   f"{text.count(sep)}; pass the second text as text_pair=")
            first, _, second = text.partition(sep)
            text, text_pair = first.strip(), second.strip()
        if text_pair is not None and not isinstance(text_pair, str):
            raise AttnlabError(f"text_pair: expected a string or None, got "
                               f"{type(text_pair).__name__}")
        encoding = (self.tokenizer.encode(check_text(text, "text")) if text_pair is None else
                    self.tokenizer.encode(check_text(text, "text"),
                                          check_text(text_pair, "text_pair")))
        ids = np.array([encoding.ids], dtype=np.int64)  # (1, T)
        types = np.array([encoding.type_ids], dtype=np.int64)  # (1, T)
        return ids, types, list(encoding.tokens)

    def run(
        self,
        text: str,
        *,
        text_pair: str | None = None,
        keep: str | tuple[str, ...] = ("weights",),
        layers: list[int] | None = None,
        heads: list[int] | None = None,
    ) -> Trace:
        """Trace one text (or the sentence pair ``text``, ``text_pair``, with their
        token types; see :meth:`encode_pair`) through the model: per-layer, per-head steps.

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
        ids, types, tokens = self.encode_pair(text, text_pair)
        hidden = self.forward(ids, None, types, recorder=recorder)  # (1, T, E)
        meta = {"model": self.name, "layers": self.config.num_hidden_layers,
                "heads": self.config.num_attention_heads, "T": len(tokens),
                "hidden": hidden[0]}
        return Trace(steps=recorder.steps, tokens=tokens, meta=meta)

    def attentions(self, text: str, *, text_pair: str | None = None
                   ) -> tuple[np.ndarray, list[str]]:
        """Attention weights of every layer and head (L, H, T, T), and the tokens, of a
        text or of the sentence pair (``text``, ``text_pair``)."""
        trace = self.run(text, text_pair=text_pair)
        return trace.attention(), trace.tokens


def check_max_length(value: Any, config: BertConfig) -> int:
    """``max_length``: an int in 1..max_position_embeddings (the model has no positions
    beyond them)."""
    limit = config.max_position_embeddings
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not (
        1 <= value <= limit
    ):
        raise AttnlabError(msg("models.max_length", name="max_length", limit=limit,
                               got=repr(value)))
    return int(value)


def _text_list(texts: Any) -> list[str]:
    """``texts`` as a list of strings, or AttnlabError naming what was passed instead."""
    iterable = hasattr(texts, "__iter__") and not isinstance(texts, (str, bytes))
    items = list(texts) if iterable else None  # a generator is read once, here
    if items is None or not all(isinstance(t, str) for t in items):
        raise AttnlabError(f"texts: expected a list of strings, got {type(texts).__name__}")
    for index, text in enumerate(items):  # the tokenizer's own refusal is a bare TypeError
        check_text(text, f"texts[{index}]")
    return items
