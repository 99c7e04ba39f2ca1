"""attnlab.hf — attnlab inside Hugging Face transformers models.

- :func:`register` makes ``attn_implementation="attnlab"`` run a model's attention on
  attnlab's kernels (attention function and mask function; :mod:`attnlab.hf.attention`
  says what each keyword transformers passes becomes).
- :func:`verify` runs a model on attnlab's float64 plain path, on eager and on sdpa
  over the same inputs and reports, per layer and head, where they part and whether
  by rounding or by a bug (:mod:`attnlab.hf.verify`).

Dimension legend: B batch, H query heads, Hkv key/value heads, T query length,
S key length, D head dim. Mask convention: bool, **True = may attend**.

Needs transformers (``pip install 'attnlab[hf]'``). Loading a model never runs
remote code.
"""

from ..errors import missing_extra

try:
    import torch  # noqa: F401
    import transformers  # noqa: F401
except ImportError as error:
    raise missing_extra(error.name or "transformers", "hf", "attnlab.hf") from None

from .attention import BACKENDS
from .register import register, registered_backend
from .verify import VerifyReport, verify

__all__ = ["BACKENDS", "VerifyReport", "register", "registered_backend", "verify"]
