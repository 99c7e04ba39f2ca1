"""A trainable BERT encoder built from attnlab.torch blocks, loaded from the same files as the
NumPy :class:`attnlab.models.BertModel`, which it equals.

    embeddings = LN(word[ids] + position[0..T-1] + token_type[types])
    for each layer (post-LN):
        h = LN1(x + Drop(MHA(x, key_padding)))
        x = LN2(h + Drop(W2 act(W1 h)))
    sentence = normalize(mean of x over real tokens)        # sentence-transformers

Attention is :class:`attnlab.torch.MultiHeadAttention`, LayerNorm
:class:`attnlab.torch.LayerNorm`; the module is an ordinary ``nn.Module``: move it with
``.to(device)``, fine-tune it with any optimizer. Every intermediate is a named hook
point (:mod:`attnlab.hooks`, the NumPy model's names): :meth:`BertModel.capture_attention`
reads the attention weights at ``blocks.{l}.attn.hook_pattern``.

Dimension legend: B batch, L layers, H heads, T tokens, E hidden width, F intermediate
width.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from ...checks import check_text, shape_str
from ...errors import AttnlabError, ShapeError
from ...hooks import HookSite, attached
from ...models import bert as np_bert
from ...models import loading as np_loading
from ...models.config import ACTIVATION, BertConfig
from ..checks import check_probability
from ..layers import LayerNorm
from ..multihead import MultiHeadAttention

__all__ = ["BertLayer", "BertModel", "load_bert", "load_minilm"]

_ACTIVATIONS = {"gelu": lambda: nn.GELU(), "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
                "relu": lambda: nn.ReLU()}


class BertLayer(nn.Module):
    """One post-LN encoder block: x (B, T, E) -> (B, T, E), with the hook points of the
    NumPy :class:`attnlab.EncoderBlock` (see :mod:`attnlab.hooks`)."""

    def __init__(self, attn: MultiHeadAttention, norm1: LayerNorm, ffn: nn.Sequential,
                 norm2: LayerNorm, dropout: float) -> None:
        super().__init__()
        self.self_attn, self.norm1, self.ffn, self.norm2 = attn, norm1, ffn, norm2
        self.dropout = nn.Dropout(dropout)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The NumPy :class:`attnlab.EncoderBlock`'s names (post-LN), in the same order."""
        return ["hook_resid_pre", ("attn", self.self_attn), "hook_attn_out", ("ln1", self.norm1),
                "hook_resid_mid", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out",
                ("ln2", self.norm2), "hook_resid_post"]

    def forward(self, x: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        site = self.hook_site
        if site is None:
            attended, _ = self.self_attn(x, x, x, key_padding=key_padding)  # (B, T, E)
            h = self.norm1(x + self.dropout(attended))  # (B, T, E)
            return self.norm2(h + self.dropout(self.ffn(h)))  # (B, T, E)
        x = site("hook_resid_pre", x)  # (B, T, E)
        attended, _ = self.self_attn(x, x, x, key_padding=key_padding)  # (B, T, E)
        attended = site("hook_attn_out", attended)
        h = site("hook_resid_mid", self.norm1(x + self.dropout(attended)))  # (B, T, E)
        pre = site("mlp.hook_pre", self.ffn[0](h))  # (B, T, F)
        post = site("mlp.hook_post", self.ffn[1](pre))  # (B, T, F)
        mlp_out = site("hook_mlp_out", self.ffn[2](post))  # (B, T, E)
        return site("hook_resid_post", self.norm2(h + self.dropout(mlp_out)))  # (B, T, E)


class BertModel(nn.Module):
    """BERT on attnlab.torch blocks; equals :class:`attnlab.models.BertModel` on the same
    weights. Built by :func:`load_bert` / :func:`load_minilm` (in eval mode, as
    pretrained models are handed out; call ``.train()`` to fine-tune with dropout).

    Shapes: ``forward(input_ids (B, T), attention_mask (B, T) of 0/1)`` -> hidden
    (B, T, E); ``encode(texts)`` -> (n, E) sentence embeddings (differentiable unless
    called under ``torch.no_grad()``).

    Hook points (:mod:`attnlab.hooks`): the NumPy twin's, ``hook_embed``,
    ``hook_pos_embed``, ``hook_token_type_embed`` (B, T, E), then ``blocks.{l}.*``.
    """

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The embeddings' points, then every block's under ``blocks.{l}``."""
        return ["hook_embed", "hook_pos_embed", "hook_token_type_embed",
                *((f"blocks.{i}", layer) for i, layer in enumerate(self.layers))]

    def __init__(self, config: BertConfig, tokenizer: Any, *, max_length: int,
                 dropout: float = 0.1, name: str = "bert", device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        p = check_probability(dropout, "dropout")
        factory = {"device": device, "dtype": dtype}
        E, H = config.hidden_size, config.num_attention_heads
        self.config, self.tokenizer, self.name = config, tokenizer, name
        self.max_length = max_length
        self.word_embeddings = nn.Embedding(config.vocab_size, E, **factory)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, E, **factory)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E, **factory)
        self.embedding_norm = LayerNorm(E, config.layer_norm_eps, **factory)
        self.embedding_dropout = nn.Dropout(p)
        activation = _ACTIVATIONS[ACTIVATION[config.hidden_act]]
        self.layers = nn.ModuleList(
            BertLayer(
                MultiHeadAttention(H, E, dropout=p, **factory),
                LayerNorm(E, config.layer_norm_eps, **factory),
                nn.Sequential(nn.Linear(E, config.intermediate_size, **factory), activation(),
                              nn.Linear(config.intermediate_size, E, **factory)),
                LayerNorm(E, config.layer_norm_eps, **factory),
                p,
            )
            for _ in range(config.num_hidden_layers)
        )

    @property
    def max_length(self) -> int:
        """Tokens kept per text (longer input is truncated); settable at any time."""
        return self._max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max_length = np_bert.check_max_length(value, self.config)
        if self.tokenizer is not None:  # the tokenizer is what truncates
            self.tokenizer.enable_truncation(max_length=self._max_length)

    @classmethod
    def from_numpy(cls, model: np_bert.BertModel, *, dropout: float = 0.1,
                   device: Any = None, dtype: Any = None) -> BertModel:
        """The same weights as a NumPy :class:`attnlab.models.BertModel` (its tokenizer
        copied, so that each model's ``max_length`` stays its own)."""
        if not isinstance(model, np_bert.BertModel):
            raise AttnlabError(
                f"model: expected an attnlab.models.BertModel, got {type(model).__name__}"
            )
        tokenizer = model.tokenizer
        if tokenizer is not None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(tokenizer.to_str())
        module = cls(model.config, tokenizer, max_length=model.max_length, dropout=dropout,
                     name=model.name, device="meta", dtype=dtype)
        like = torch.empty(0, device=device, dtype=dtype)

        def param(array: np.ndarray, transpose: bool = False) -> nn.Parameter:
            # A copy: training must not write into the NumPy model's arrays.
            values = array.T if transpose else array
            return nn.Parameter(torch.tensor(values, device=like.device, dtype=like.dtype))

        module.word_embeddings.weight = param(model.word_embeddings)  # (V, E)
        module.position_embeddings.weight = param(model.position_embeddings)  # (P, E)
        module.token_type_embeddings.weight = param(model.token_type_embeddings)  # (2, E)
        module.embedding_norm = LayerNorm.from_numpy(model.embedding_norm, device=like.device,
                                                     dtype=like.dtype)
        for ours, block in zip(module.blocks(), model.layers, strict=True):
            attn = MultiHeadAttention.from_numpy(block.attn, dropout=dropout,
                                                 device=like.device, dtype=like.dtype)
            ours.self_attn = attn.train(module.training)
            ours.norm1 = LayerNorm.from_numpy(block.norm1, device=like.device, dtype=like.dtype)
            ours.norm2 = LayerNorm.from_numpy(block.norm2, device=like.device, dtype=like.dtype)
            first, second = cast(nn.Linear, ours.ffn[0]), cast(nn.Linear, ours.ffn[2])
            first.weight = param(block.ffn.W1, transpose=True)  # (F, E)
            first.bias = param(block.ffn.b1)  # (F,)
            second.weight = param(block.ffn.W2, transpose=True)  # (E, F)
            second.bias = param(block.ffn.b2)  # (E,)
        return module.eval()

    # ---- the encoder -----------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Last hidden states (B, T, E). ``attention_mask`` 1 = real token (HF style)."""
        if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or (
            input_ids.is_floating_point() or input_ids.dtype == torch.bool
        ):
            got = (f"{input_ids.dtype} {shape_str(input_ids.shape)}"
                   if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__)
            raise ShapeError(f"input_ids: expected an integer tensor (B, T), got {got}")
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ShapeError(f"input_ids: expected at most "
                             f"{self.config.max_position_embeddings} tokens, got {T}")
        key_padding = None
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != (B, T):
                got = (shape_str(attention_mask.shape) if isinstance(attention_mask, torch.Tensor)
                       else type(attention_mask).__name__)
                raise ShapeError(f"attention_mask: expected {shape_str((B, T))} to match "
                                 f"input_ids, got {got}")
            key_padding = attention_mask.to(device=input_ids.device) != 0  # (B, T), True = real
        positions = torch.arange(T, device=input_ids.device)  # (T,)
        types = (torch.zeros_like(input_ids) if token_type_ids is None
                 else token_type_ids)  # (B, T)
        site = self.hook_site
        if site is None:
            x = (self.word_embeddings(input_ids) + self.position_embeddings(positions)
                 + self.token_type_embeddings(types))  # (B, T, E)
        else:
            words = site("hook_embed", self.word_embeddings(input_ids))  # (B, T, E)
            where = site("hook_pos_embed", self.position_embeddings(positions).expand_as(words))
            kinds = site("hook_token_type_embed", self.token_type_embeddings(types))  # (B, T, E)
            x = words + where + kinds  # (B, T, E)
        x = self.embedding_dropout(self.embedding_norm(x))  # (B, T, E)
        for layer in self.layers:
            x = layer(x, key_padding)  # (B, T, E)
        return x

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
        """Token ids (B, T) padded with pad_token_id and attention mask (B, T) of 0/1, on
        the model's device, and the tokens."""
        encodings = self.tokenizer.encode_batch(_text_list(texts))
        ids, real = self._pad([e.ids for e in encodings])  # (B, T), (B, T)
        return ids, real, [list(e.tokens) for e in encodings]

    def _pad(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token id lists -> ids (B, T) padded with pad_token_id, attention mask (B, T)."""
        T = max((len(seq) for seq in sequences), default=0)
        device = self.word_embeddings.weight.device
        ids = torch.full((len(sequences), T), self.config.pad_token_id, dtype=torch.long)
        real = torch.zeros(len(sequences), T, dtype=torch.long)  # (B, T)
        for row, seq in enumerate(sequences):
            ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            real[row, : len(seq)] = 1
        return ids.to(device), real.to(device)

    def encode(self, texts: list[str], batch_size: int = 32, *,
               normalize: bool = True) -> torch.Tensor:
        """Sentence embeddings (n, E): mean over real tokens, then L2-normalised, as
        sentence-transformers computes them. Batched as the NumPy model does (sorted by
        token count); the result is in the input order."""
        texts = [check_text(texts, "texts")] if isinstance(texts, str) else _text_list(texts)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise AttnlabError(f"batch_size: expected a positive integer, got {batch_size!r}")
        sequences = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = np.argsort([-len(seq) for seq in sequences], kind="stable")
        device = self.word_embeddings.weight.device
        pooled_parts, positions = [], []
        for start in range(0, len(texts), batch_size):
            chunk = order[start: start + batch_size]
            ids, real = self._pad([sequences[i] for i in chunk])  # (b, T), (b, T)
            hidden = self.forward(ids, real)  # (b, T, E)
            weights = real[..., None].to(hidden.dtype)  # (b, T, 1)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1e-9)  # (b, E)
            if normalize:
                pooled = pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            pooled_parts.append(pooled)
            positions.append(torch.from_numpy(chunk))
        if not pooled_parts:
            return torch.zeros(0, self.config.hidden_size, device=device)
        inverse = torch.argsort(torch.cat(positions)).to(device)  # sorted row -> input row
        return torch.cat(pooled_parts)[inverse]  # (n, E)

    @contextmanager
    def capture_attention(self) -> Iterator[list[torch.Tensor]]:
        """Collect each layer's attention weights (B, H, T, T) during the ``with`` block,
        read at the hook points ``blocks.{l}.attn.hook_pattern`` (removed when the block
        ends, normally or by an exception). One entry per layer per forward call.

        >>> with model.capture_attention() as weights:          # doctest: +SKIP
        ...     model(ids, real)
        >>> len(weights), weights[0].shape                      # doctest: +SKIP
        (6, torch.Size([1, 12, 7, 7]))
        """
        captured: list[torch.Tensor] = []

        def keep(pattern: torch.Tensor, name: str) -> None:
            captured.append(pattern)  # (B, H, T, T)

        with attached(self, [(lambda name: name.endswith(".attn.hook_pattern"), keep)]):
            yield captured

    def blocks(self) -> list[BertLayer]:
        """The encoder layers, typed (``self.layers`` is their ``nn.ModuleList``)."""
        return [cast(BertLayer, layer) for layer in self.layers]


def load_bert(path: str | Path, *, max_length: int | None = None, dropout: float = 0.1,
              device: Any = None, dtype: Any = None) -> BertModel:
    """A :class:`BertModel` from a local directory (``config.json``, ``model.safetensors``,
    ``tokenizer.json``), read and checked as :func:`attnlab.models.load_bert` does.

    ``max_length`` as there (default: ``max_seq_length`` of ``sentence_bert_config.json``,
    else the model's positions); ``dropout`` (BERT's 0.1) acts in training mode only.
    """
    model = np_loading.load_bert(path, max_length=max_length)
    return BertModel.from_numpy(model, dropout=dropout, device=device, dtype=dtype)


def load_minilm(*, max_length: int | None = None, dropout: float = 0.1, device: Any = None,
                dtype: Any = None) -> BertModel:
    """sentence-transformers' all-MiniLM-L6-v2 as a trainable :class:`BertModel`, offline."""
    model = np_loading.load_minilm(max_length=max_length)
    return BertModel.from_numpy(model, dropout=dropout, device=device, dtype=dtype)


def _text_list(texts: Any) -> list[str]:
    """``texts`` as a list of strings, or AttnlabError naming what was passed instead."""
    if isinstance(texts, str):
        raise AttnlabError("texts: expected a list of strings, got str")
    items = list(texts) if hasattr(texts, "__iter__") and not isinstance(texts, bytes) else None
    if items is None or not all(isinstance(t, str) for t in items):
        raise AttnlabError(f"texts: expected a list of strings, got {type(texts).__name__}")
    for index, text in enumerate(items):  # the tokenizer's own refusal is a bare TypeError
        check_text(text, f"texts[{index}]")
    return items
