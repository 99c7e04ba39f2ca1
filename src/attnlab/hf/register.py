"""Registering attnlab with transformers: an attention function and its mask function.

Registering an attention function alone makes transformers pass
``attention_mask=None`` (padding and the causal rule silently dropped): a name
needs a mask function too, registered with ``AttentionMaskInterface``.
"""

from __future__ import annotations

from typing import Any

from ..errors import AttnlabError
from .attention import attention_function, check_backend

__all__ = ["register"]


def register(name: str = "attnlab", *, backend: str = "torch") -> str:
    """Register attnlab under ``name`` with transformers; returns ``name``.

    After it, ``AutoModel.from_pretrained(path, attn_implementation=name)`` and
    ``model.set_attn_implementation(name)`` run every attention layer that
    dispatches through transformers' attention functions on attnlab's
    ``backend`` (see :mod:`attnlab.hf.attention`): ``"torch"`` (fused),
    ``"plain"`` (attnlab's plain path, float64 capable) or ``"triton"`` (CUDA).

    Registers the attention function with ``AttentionInterface`` and a mask
    function with ``AttentionMaskInterface``: for "torch" and "plain"
    transformers' ``sdpa_mask`` (bool (B, 1, T, S), True = may attend, attnlab's
    convention; None where the causal rule alone is right), for "triton" the same,
    read back as key padding. Idempotent: registering the same name and backend
    again changes nothing; another backend under the same name replaces it.

    Example::

        attnlab.hf.register()  # -> "attnlab"
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attnlab")
    """
    if not isinstance(name, str) or not name or name in _RESERVED:
        raise AttnlabError(
            f"name: expected a new attention implementation name (not one of transformers' "
            f"own: {', '.join(sorted(_RESERVED))}), got {name!r}")
    function = attention_function(check_backend(backend))
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def registered_backend(name: str) -> str | None:
    """The attnlab backend registered under ``name``, or None."""
    from transformers import AttentionInterface

    from .attention import BACKENDS

    function: Any = AttentionInterface._global_mapping.get(name)
    for backend in BACKENDS:
        if function is attention_function(backend):
            return backend
    return None


_RESERVED = frozenset({"eager", "sdpa", "flash_attention_2", "flash_attention_3",
                       "flash_attention_4", "flex_attention", "paged_attention"})
