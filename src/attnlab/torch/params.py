"""Moving parameter values between NumPy arrays and tensors.

The NumPy core stores projections (in, out) and applies ``X @ W``; ``nn.Linear``
stores (out, in), so matrices are transposed on the way: ``W_numpy = weight.T``.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import AttnlabError

__all__ = ["to_param", "to_array", "to_optional_array", "torch_dtype"]


def to_param(array: np.ndarray, *, transpose: bool, like: torch.Tensor) -> torch.Tensor:
    """A NumPy (in, out) matrix or a vector as a tensor shaped and typed like ``like``."""
    values = torch.from_numpy(np.ascontiguousarray(array.T if transpose else array))
    return values.to(dtype=like.dtype, device=like.device)


def to_array(t: torch.Tensor, *, transpose: bool = False) -> np.ndarray:
    """A parameter as a NumPy array (float16 / bfloat16 as float32, which NumPy can hold)."""
    if t.device.type == "meta":
        raise AttnlabError(
            "module: expected parameters holding values, got parameters on the meta device, "
            "which hold none; materialise the module first (e.g. .to_empty(device='cpu') "
            "and load its weights)"
        )
    values = t.detach().cpu()
    if values.dtype in (torch.float16, torch.bfloat16):
        values = values.float()
    arr = values.numpy()
    return np.ascontiguousarray(arr.T if transpose else arr).copy()


def to_optional_array(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else to_array(t)


def torch_dtype(*arrays: np.ndarray | None) -> torch.dtype:
    dtype = np.result_type(*(a for a in arrays if a is not None))
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
