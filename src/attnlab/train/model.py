"""A small causal decoder on attnlab.torch modules, made to be trained and looked into.

Dimension legend: B batch, T tokens, L layers, H heads, D head dim, E model width,
F feed-forward width, V vocabulary size.

    x      = embed[ids] (+ positions[t] if learned / sinusoidal)          (B, T, E)
    block  : pre-LN   h = x + MHA(LN1(x));     x = h + FFN(LN2(h))
             post-LN  h = LN1(x + MHA(x));     x = LN2(h + FFN(h))
             (attention-only: no FFN and no LN2)
    logits = LN_f(x) @ W_unembed   (LN_f only with pre-LN)                (B, T, V)

Attention is :class:`attnlab.torch.MultiHeadAttention` with ``is_causal=True``
(and ``rope=True`` for RoPE positions); the norms are :class:`attnlab.torch.LayerNorm`
and the sinusoidal table :class:`attnlab.torch.PositionalEncoding`.

``scale=False`` trains without 1/√D: MultiHeadAttention always multiplies the scores
by 1/√D, so the queries are multiplied by √D first (a hook on ``q_proj``) and the
two cancel; for D a power of 4 (16, 64, 256) both factors are powers of two and
cancel exactly.

Heads can be ablated during evaluation (:meth:`Decoder.ablate`): a head's output
(``blocks.{l}.attn.hook_z``, before the output projection) is replaced by zeros or by
its mean over a reference batch. Every intermediate is a named hook point
(:mod:`attnlab.hooks`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import InitVar, asdict, dataclass
from numbers import Integral
from typing import Any, Literal, cast

import torch
from torch import nn

from ..checks import check_flag, check_positive_int
from ..errors import AttnlabError
from ..hooks import HookSite, attached
from ..messages import msg
from ..torch import LayerNorm, MultiHeadAttention, PositionalEncoding

__all__ = ["POSITIONS", "DecoderConfig", "Decoder", "Block", "AblationMode"]

Positions = Literal["learned", "sinusoidal", "rope", "none"]
POSITIONS: tuple[Positions, ...] = ("learned", "sinusoidal", "rope", "none")
AblationMode = Literal["zero", "mean"]


@dataclass(frozen=True)
class DecoderConfig:
    """Sizes and options of :class:`Decoder`.

    ``head_dim`` (D) defaults to E // H; ``d_ff`` (F) to 4E; ``max_len`` is the longest
    input (T) the position table holds; ``pos`` is the positional encoding, one of
    :data:`POSITIONS` (the name ``explain(pos=)`` and ``attnlab train --pos`` use).
    ``positions=`` is the former name of ``pos`` (deprecated, warns).
    """

    vocab_size: int
    max_len: int
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    head_dim: int | None = None
    d_ff: int | None = None
    attn_only: bool = False
    pos: Positions = "learned"
    norm: Literal["pre", "post"] = "pre"
    scale: bool = True
    positions: InitVar[Positions | None] = None

    def __post_init__(self, positions: Positions | None) -> None:
        if positions is not None:
            warnings.warn("DecoderConfig(positions=...) is deprecated: say pos=...",
                          DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "pos", positions)
        for name in ("vocab_size", "max_len", "d_model", "num_heads", "num_layers"):
            check_positive_int(getattr(self, name), name)
        for name in ("head_dim", "d_ff"):
            if getattr(self, name) is not None:
                check_positive_int(getattr(self, name), name)
        for name in ("attn_only", "scale"):
            check_flag(getattr(self, name), name)
        if self.pos not in POSITIONS:
            raise AttnlabError(f"pos: expected one of {', '.join(POSITIONS)}, "
                               f"got {self.pos!r}")
        if self.norm not in ("pre", "post"):
            raise AttnlabError(f"norm: expected 'pre' or 'post', got {self.norm!r}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise AttnlabError(msg("train.d_model_heads", heads=self.num_heads, got=self.d_model))
        if self.pos == "rope" and self.D % 2:
            raise AttnlabError(msg("train.rope_even", got=self.D))

    @property
    def D(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Block(nn.Module):
    """One decoder block (see the module doc), with attnlab's hook point names."""

    def __init__(self, config: DecoderConfig, generator: torch.Generator) -> None:
        super().__init__()
        E, H, D = config.d_model, config.num_heads, config.D
        self.norm_placement = config.norm
        self.num_heads, self.head_dim = H, D
        self.attn = MultiHeadAttention(H, E, head_dim=D, rope=config.pos == "rope",
                                       generator=generator)
        self.norm1 = LayerNorm(E)
        self.ffn: nn.Sequential | None = None
        self.norm2: LayerNorm | None = None
        if not config.attn_only:
            F = config.d_ff if config.d_ff is not None else 4 * E
            up, down = nn.Linear(E, F), nn.Linear(F, E)
            self.ffn = nn.Sequential(up, nn.GELU(), down)
            self.norm2 = LayerNorm(E)
            for linear in (up, down):
                nn.init.normal_(linear.weight, std=0.02, generator=generator)
                nn.init.zeros_(linear.bias)
        if not config.scale:  # cancel MultiHeadAttention's 1/√D (see the module doc)
            root = math.sqrt(D)
            self.attn.q_proj.register_forward_hook(lambda _m, _i, out: out * root)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """The names of attnlab's blocks (see :mod:`attnlab.hooks`), in forward order; an
        attention-only block has no resid_mid, ln2 or mlp points."""
        mlp: list[str | tuple[str, Any]] = []
        if self.ffn is not None and self.norm2 is not None:
            mlp = ["hook_resid_mid", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out"]
            mlp = ([mlp[0], ("ln2", self.norm2), *mlp[1:]] if self.norm_placement == "pre"
                   else [*mlp, ("ln2", self.norm2)])
        if self.norm_placement == "pre":
            return ["hook_resid_pre", ("ln1", self.norm1), ("attn", self.attn), "hook_attn_out",
                    *mlp, "hook_resid_post"]
        return ["hook_resid_pre", ("attn", self.attn), "hook_attn_out", ("ln1", self.norm1),
                *mlp, "hook_resid_post"]

    def forward(
        self, x: torch.Tensor, return_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, T, E) -> (B, T, E), (B, H, T, T)
        weights = None
        site = self.hook_site

        def point(name: str, value: torch.Tensor) -> torch.Tensor:
            return value if site is None else site(name, value)

        def attend(h: torch.Tensor) -> torch.Tensor:
            nonlocal weights
            out, kept = self.attn(h, h, h, is_causal=True, return_weights=return_weights)
            if return_weights:
                weights = kept  # (B, H, T, T)
            return point("hook_attn_out", cast(torch.Tensor, out))

        def mlp(h: torch.Tensor, ffn: nn.Sequential) -> torch.Tensor:
            pre = point("mlp.hook_pre", ffn[0](h))  # (B, T, F)
            post = point("mlp.hook_post", ffn[1](pre))  # (B, T, F)
            return point("hook_mlp_out", ffn[2](post))  # (B, T, E)

        x = point("hook_resid_pre", x)
        if self.norm_placement == "pre":
            x = x + attend(self.norm1(x))  # (B, T, E)
            if self.ffn is not None and self.norm2 is not None:
                x = point("hook_resid_mid", x)
                x = x + mlp(self.norm2(x), self.ffn)
        else:
            x = self.norm1(x + attend(x))  # (B, T, E)
            if self.ffn is not None and self.norm2 is not None:
                x = point("hook_resid_mid", x)
                x = self.norm2(x + mlp(x, self.ffn))
        return point("hook_resid_post", x), weights


class Decoder(nn.Module):
    """The causal decoder of :class:`DecoderConfig`, initialised from ``seed``.

    >>> model = Decoder(DecoderConfig(vocab_size=10, max_len=8, d_model=16, num_heads=2))
    >>> logits, weights = model(torch.zeros(3, 8, dtype=torch.long), return_weights=True)
    >>> tuple(logits.shape), tuple(weights.shape)
    ((3, 8, 10), (3, 2, 2, 8, 8))
    """

    def __init__(self, config: DecoderConfig, *, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(config, DecoderConfig):
            raise AttnlabError(f"config: expected a DecoderConfig, got {type(config).__name__}")
        self.config = config
        generator = torch.Generator().manual_seed(check_positive_int(seed, "seed",
                                                                     allow_zero=True))
        E, V = config.d_model, config.vocab_size
        self.embed = nn.Embedding(V, E)
        nn.init.normal_(self.embed.weight, std=0.02, generator=generator)
        self.position: nn.Module | None = None
        if config.pos == "learned":
            self.position = nn.Embedding(config.max_len, E)
            nn.init.normal_(self.position.weight, std=0.02, generator=generator)
        elif config.pos == "sinusoidal":
            self.position = PositionalEncoding(E, config.max_len, dtype=torch.float32)
        self.blocks = nn.ModuleList(Block(config, generator) for _ in range(config.num_layers))
        self.layers: list[Block] = [cast(Block, block) for block in self.blocks]  # typed view
        self.final_norm = LayerNorm(E) if config.norm == "pre" else None
        self.unembed = nn.Linear(E, V)
        nn.init.normal_(self.unembed.weight, std=0.02, generator=generator)
        nn.init.zeros_(self.unembed.bias)

    hook_site: HookSite | None = None  # set while hooks are attached (attnlab.hooks)

    def hook_points(self) -> list[str | tuple[str, Any]]:
        """``hook_embed``, ``hook_pos_embed`` (learned or sinusoidal positions), every
        block's points under ``blocks.{l}``, ``ln_final.hook_normalized`` (pre-LN)."""
        names: list[str | tuple[str, Any]] = ["hook_embed"]
        if self.position is not None:
            names.append("hook_pos_embed")
        names += [(f"blocks.{i}", block) for i, block in enumerate(self.layers)]
        if self.final_norm is not None:
            names.append(("ln_final", self.final_norm))
        return names

    def forward(
        self, ids: torch.Tensor, return_weights: bool = False
    ) -> Any:  # (B, T) -> (B, T, V) [, (B, L, H, T, T)]
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.ndim != 2:
            raise AttnlabError(f"ids: expected a (B, T) int64 tensor, got "
                               f"{getattr(ids, 'dtype', type(ids).__name__)} "
                               f"{tuple(getattr(ids, 'shape', ()))}")
        T = ids.shape[1]
        if T > self.config.max_len:
            raise AttnlabError(f"ids: expected T <= max_len = {self.config.max_len}, got {T}")
        x = self.embed(ids)  # (B, T, E)
        site = self.hook_site
        if site is not None:
            x = site("hook_embed", x)
            if self.position is not None:
                table = (self.position.weight[:T] if isinstance(self.position, nn.Embedding)
                         else self.position(torch.zeros_like(x)))  # (T, E) or (B, T, E)
                x = x + site("hook_pos_embed", table.expand_as(x))  # (B, T, E)
        elif isinstance(self.position, nn.Embedding):
            x = x + self.position.weight[:T]  # (B, T, E)
        elif self.position is not None:
            x = self.position(x)  # (B, T, E)
        weights = []
        for block in self.layers:
            x, w = block(x, return_weights)
            weights.append(w)
        if self.final_norm is not None:
            x = self.final_norm(x)
        logits = self.unembed(x)  # (B, T, V)
        if return_weights:
            return logits, torch.stack(weights, dim=1)  # (B, L, H, T, T)
        return logits

    @contextmanager
    def ablate(
        self, heads: Sequence[tuple[int, int]], mode: AblationMode = "zero",
        reference: torch.Tensor | None = None, *, name: str = "heads",
    ) -> Iterator[None]:
        """Within the block, the (layer, head) pairs' outputs are zeros (``"zero"``) or their
        mean over the positions and examples of ``reference`` (B, T) ids (``"mean"``).
        ``name``: the argument the pairs came in as (for errors)."""
        L, H = self.config.num_layers, self.config.num_heads
        pairs: list[tuple[int, int]] = []
        for item in heads:
            if not (isinstance(item, tuple | list) and len(item) == 2 and all(
                    isinstance(i, Integral) and not isinstance(i, bool) for i in item)):
                raise AttnlabError(msg("train.head_pairs", name=name, got=repr(item)))
            pairs.append((int(item[0]), int(item[1])))
        for layer, head in pairs:
            if not (0 <= layer < L and 0 <= head < H):
                raise AttnlabError(f"{name}: expected (layer, head) with 0 <= layer < {L} and "
                                   f"0 <= head < {H}, got ({layer}, {head})")
        if mode not in ("zero", "mean"):
            raise AttnlabError(f"mode: expected 'zero' or 'mean', got {mode!r}")
        means: list[torch.Tensor | None] = [None] * L
        if mode == "mean":
            if reference is None:
                raise AttnlabError("reference: mean ablation needs a (B, T) batch of ids")

            def keep_mean(z: torch.Tensor, hook: str) -> None:
                layer = int(hook.split(".")[1])
                means[layer] = z.detach().mean(dim=(0, 2))  # (H, Dv) over batch and positions

            with torch.no_grad(), attached(self, [(_is_head_output, keep_mean)]):
                self(reference)
        by_layer: dict[int, list[int]] = {}
        for layer, head in pairs:
            by_layer.setdefault(layer, []).append(head)

        def replace(z: torch.Tensor, hook: str) -> torch.Tensor | None:
            layer = int(hook.split(".")[1])
            if layer not in by_layer:
                return None
            z = z.clone()  # (B, H, T, Dv)
            mean = means[layer]
            for head in by_layer[layer]:
                z[:, head] = 0.0 if mean is None else mean[head]
            return z

        with attached(self, [(_is_head_output, replace)]):
            yield


def _is_head_output(name: str) -> bool:
    return name.startswith("blocks.") and name.endswith(".attn.hook_z")


def __getattr__(name: str) -> Any:
    if name == "ModelConfig":  # the former name, kept for a while
        warnings.warn("attnlab.train.ModelConfig is deprecated: it is DecoderConfig",
                      DeprecationWarning, stacklevel=2)
        return DecoderConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
