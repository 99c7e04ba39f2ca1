"""The configuration of a BERT encoder, and the checks of its weight tensors.

Every tensor's name, shape and dtype is checked against the config before
anything runs: a missing, extra, misshaped or non-float tensor is a
:class:`ModelFileError` naming the file.

Dimension legend: L layers, E hidden width, F intermediate width, V vocabulary.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import shape_str
from ..errors import AttnlabError

__all__ = ["ACTIVATION", "IGNORED_TENSORS", "BertConfig", "ModelFileError", "check_tensors",
           "is_json_int", "short_repr"]

#: Hugging Face ``hidden_act`` -> attnlab's activation name.
ACTIVATION = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
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
                                 f"{type(data).__name__} {short_repr(data)}")
        ints = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size")
        missing = [k for k in (*ints, "layer_norm_eps") if k not in data]
        if missing:
            raise ModelFileError(f"{source}: missing keys {missing}")
        for key in ints:
            if not is_json_int(data[key]) or data[key] < 1:
                raise ModelFileError(f"{source}: {key} expected a positive integer, "
                                     f"got {short_repr(data[key])}")
        eps = data["layer_norm_eps"]
        if not (is_json_int(eps) or isinstance(eps, float)) or not 0 < eps < math.inf:
            raise ModelFileError(f"{source}: layer_norm_eps expected a finite number > 0, "
                                 f"got {short_repr(eps)}")
        pad = data.get("pad_token_id", 0)
        if pad is None:  # some configs write null: no padding token declared
            pad = 0
        if not is_json_int(pad) or not 0 <= pad < data["vocab_size"]:
            raise ModelFileError(f"{source}: pad_token_id expected an integer in "
                                 f"0..{data['vocab_size'] - 1} (vocab_size), got {short_repr(pad)}")
        if data["hidden_size"] % data["num_attention_heads"]:
            raise ModelFileError(
                f"{source}: hidden_size {data['hidden_size']} is not a multiple of "
                f"num_attention_heads {data['num_attention_heads']}"
            )
        act = data.get("hidden_act", "gelu")
        if not isinstance(act, str) or act not in ACTIVATION:
            raise ModelFileError(f"{source}: hidden_act expected one of {sorted(ACTIVATION)}, "
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


def is_json_int(value: Any) -> bool:
    """A JSON integer (``true`` reads as a Python bool, which is an int: refused)."""
    return isinstance(value, int) and not isinstance(value, bool)


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to one short line, for messages about a file's contents."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."



#: Tensors a checkpoint may carry that the encoder does not use.
IGNORED_TENSORS = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")

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
    extra = sorted(set(tensors) - set(expected) - set(IGNORED_TENSORS))
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
