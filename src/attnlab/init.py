"""Weight initialisation for projection matrices.

Every projection in attnlab is stored as ``(fan_in, fan_out)`` and applied as
``X @ W`` -- the way the seeds write it (``Q = np.dot(X, Wq)`` with ``Wq`` of
shape ``(4, 3)``). ``fan_in`` is the width of what comes in (E for Wq/Wk/Wv),
``fan_out`` the width of what goes out (H*D for Wq/Wk, H*Dv for Wv).

Randomness is always explicit: every function takes ``rng``, either a
``np.random.Generator`` or an int seed (or ``None`` for fresh, irreproducible
entropy). The global NumPy RNG (``np.random.randn``, ``np.random.seed``) is
never touched, so two calls with the same seed give the same matrix whatever
else the program does.

Schemes
-------
``"xavier"``         uniform on ``[-a, a]``, ``a = gain * sqrt(6 / (fan_in + fan_out))``
``"xavier_normal"``  normal with ``std = gain * sqrt(2 / (fan_in + fan_out))``
``"normal"``         normal with the given ``std`` (seed 000's ``np.random.randn`` is std 1)

Both Xavier variants have variance ``gain**2 * 2 / (fan_in + fan_out)``
(Glorot & Bengio, 2010), the compromise that keeps activations and gradients
at roughly the same scale going forwards and backwards.
"""

from __future__ import annotations

import math
from typing import Any, TypeAlias

import numpy as np

from .checks import check_alloc, check_positive_int
from .errors import AttnlabError
from .messages import msg

__all__ = [
    "INIT_SCHEMES",
    "RngLike",
    "as_rng",
    "xavier_uniform",
    "xavier_normal",
    "normal",
    "init_weight",
    "init_qkv",
]

#: The values ``init_weight(scheme=...)`` and ``init_qkv(scheme=...)`` accept.
INIT_SCHEMES: tuple[str, ...] = ("xavier", "xavier_normal", "normal")

#: What every ``rng=`` / ``seed=`` argument accepts (see :func:`as_rng`).
RngLike: TypeAlias = int | np.integer | np.random.Generator | None


def as_rng(seed_or_rng: RngLike) -> np.random.Generator:
    """Return a ``np.random.Generator``: ``seed_or_rng`` itself, or a new one seeded with it.

    - a ``Generator`` is returned as is (and advanced by whoever draws from it);
    - an int seed ``>= 0`` gives ``np.random.default_rng(seed)``: the same seed
      always gives the same numbers;
    - ``None`` gives ``np.random.default_rng()``, seeded from OS entropy: a new
      independent stream on every call, so results are not reproducible.

    The legacy ``np.random.RandomState`` (the global-state API) is refused.

    >>> as_rng(0).standard_normal(2).shape
    (2,)
    >>> g = np.random.default_rng(1)
    >>> as_rng(g) is g
    True
    """
    if isinstance(seed_or_rng, np.random.Generator):
        return seed_or_rng
    if seed_or_rng is None:
        return np.random.default_rng()
    if isinstance(seed_or_rng, bool) or not isinstance(seed_or_rng, (int, np.integer)):
        raise AttnlabError(msg("check.rng_type", type=type(seed_or_rng).__name__,
                               got=repr(seed_or_rng)))
    if seed_or_rng < 0:
        raise AttnlabError(msg("check.expected_got", name="rng", what=msg("phrase.seed"),
                               got=seed_or_rng))
    return np.random.default_rng(int(seed_or_rng))


def _check_scale(value: Any, name: str) -> float:
    """Return ``value`` as a float, or raise unless it is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise AttnlabError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise AttnlabError(f"{name}: expected a finite number >= 0, got {value}")
    return float(value)


def _check_scheme(scheme: Any) -> str:
    if not isinstance(scheme, str) or scheme not in INIT_SCHEMES:
        allowed = ", ".join(repr(name) for name in INIT_SCHEMES)
        raise AttnlabError(f"scheme: expected one of {allowed}, got {scheme!r}")
    return scheme


def _check_fans(fan_in: Any, fan_out: Any) -> tuple[int, int]:
    fans = check_positive_int(fan_in, "fan_in"), check_positive_int(fan_out, "fan_out")
    check_alloc(fans, np.float64, "the weight (fan_in, fan_out)", "fan_in, fan_out")
    return fans


def xavier_uniform(
    fan_in: int, fan_out: int, *, gain: float = 1.0, rng: RngLike
) -> np.ndarray:  # -> (fan_in, fan_out)
    """Glorot/Xavier uniform: ``W ~ U(-a, a)``, ``a = gain * sqrt(6 / (fan_in + fan_out))``.

    Variance ``a**2 / 3 = gain**2 * 2 / (fan_in + fan_out)``. Same bound as
    ``torch.nn.init.xavier_uniform_`` (whose fans are read from a weight stored
    ``(fan_out, fan_in)``; here the matrix is ``(fan_in, fan_out)``).

    >>> W = xavier_uniform(4, 3, rng=0)
    >>> W.shape
    (4, 3)
    >>> bool(abs(W).max() <= (6 / 7) ** 0.5)
    True
    """
    fan_in, fan_out = _check_fans(fan_in, fan_out)
    gain = _check_scale(gain, "gain")
    generator = as_rng(rng)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    if bound > _LARGEST / 2:  # the width 2·bound would overflow: draw on [-1, 1] and scale
        return bound * generator.uniform(-1.0, 1.0, size=(fan_in, fan_out))
    return generator.uniform(-bound, bound, size=(fan_in, fan_out))  # (fan_in, fan_out)


def xavier_normal(
    fan_in: int, fan_out: int, *, gain: float = 1.0, rng: RngLike
) -> np.ndarray:  # -> (fan_in, fan_out)
    """Glorot/Xavier normal: ``W ~ N(0, std**2)``, ``std = gain * sqrt(2 / (fan_in + fan_out))``.

    Not truncated (like ``torch.nn.init.xavier_normal_``).

    >>> xavier_normal(4, 3, rng=0).shape
    (4, 3)
    """
    fan_in, fan_out = _check_fans(fan_in, fan_out)
    gain = _check_scale(gain, "gain")
    generator = as_rng(rng)
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    draw = generator.standard_normal((fan_in, fan_out))  # (fan_in, fan_out)
    with np.errstate(over="ignore"):
        return _finite(std * draw, "gain", gain)


def normal(
    fan_in: int, fan_out: int, *, std: float = 1.0, rng: RngLike
) -> np.ndarray:  # -> (fan_in, fan_out)
    """Plain Gaussian: ``W ~ N(0, std**2)``.

    ``std=1`` is seed 000's ``np.random.randn(4, 3)``, but drawn from ``rng``
    instead of the global RNG. It ignores the fans, so for wide layers the
    scores ``Q @ K.T`` grow with E -- use ``"xavier"`` unless reproducing the seed.

    >>> normal(4, 3, rng=0).shape
    (4, 3)
    """
    fan_in, fan_out = _check_fans(fan_in, fan_out)
    std = _check_scale(std, "std")
    generator = as_rng(rng)
    draw = generator.standard_normal((fan_in, fan_out))  # (fan_in, fan_out)
    with np.errstate(over="ignore"):
        return _finite(std * draw, "std", std)


_LARGEST = float(np.finfo(np.float64).max)


def _finite(w: np.ndarray, name: str, value: float) -> np.ndarray:  # (fan_in, fan_out)
    """``w``, unless a huge gain/std made some of its values overflow to ±inf."""
    if not np.isfinite(w).all():
        raise AttnlabError(f"{name}: expected a value whose weights fit float64, got {value} "
                           "(some overflowed to inf)")
    return w


def init_weight(
    fan_in: int,
    fan_out: int,
    scheme: str = "xavier",
    *,
    rng: RngLike,
    gain: float = 1.0,
    std: float = 1.0,
) -> np.ndarray:  # -> (fan_in, fan_out)
    """One ``(fan_in, fan_out)`` projection matrix drawn with ``scheme``.

    ``scheme`` is one of :data:`INIT_SCHEMES`: ``"xavier"`` (uses ``gain``),
    ``"xavier_normal"`` (uses ``gain``) or ``"normal"`` (uses ``std``).

    >>> init_weight(4, 3, "normal", rng=0).shape
    (4, 3)
    """
    scheme = _check_scheme(scheme)
    if scheme == "xavier":
        return xavier_uniform(fan_in, fan_out, gain=gain, rng=rng)
    if scheme == "xavier_normal":
        return xavier_normal(fan_in, fan_out, gain=gain, rng=rng)
    return normal(fan_in, fan_out, std=std, rng=rng)


def init_qkv(
    d_model: int,
    d_q: int,
    d_k: int,
    d_v: int,
    *,
    scheme: str = "xavier",
    v_gain: float = 1.0,
    rng: RngLike,
    gain: float = 1.0,
    std: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # -> (E, d_q), (E, d_k), (E, d_v)
    """The three input projections ``(Wq, Wk, Wv)`` of one attention layer.

    Shapes: ``Wq (E, d_q)``, ``Wk (E, d_k)``, ``Wv (E, d_v)`` with ``E = d_model``;
    for multi-head attention ``d_q = d_k = H*D`` and ``d_v = H*Dv``. ``d_q`` must
    equal ``d_k``, since the scores are ``Q @ K.T``.

    All three are drawn with ``scheme`` (and ``gain`` / ``std``) from the same
    generator, in the order Wq, Wk, Wv; then ``Wv`` alone is multiplied by
    ``v_gain``. So Wq and Wk do not depend on ``v_gain``.

    Why a smaller V (seed 001: "Q/K projections use Xavier, V a smaller scale"):
    Q and K only set the *sharpness* of the softmax, while the attention output
    is a convex combination of the rows of V and goes straight into the residual
    stream. ``v_gain < 1`` makes the attention branch start small, so that
    ``x + attention(x)`` begins close to ``x`` -- the same idea as GPT-2's
    ``1/sqrt(2 * n_layers)`` scaling of residual projections. ``v_gain=0.5`` is
    a moderate choice (it halves the branch's standard deviation and quarters
    its variance); the seed names no number, and ``v_gain=1.0`` (the default)
    is plain Xavier for all three.

    >>> Wq, Wk, Wv = init_qkv(4, 3, 3, 3, v_gain=0.5, rng=0)
    >>> Wq.shape, Wk.shape, Wv.shape
    ((4, 3), (4, 3), (4, 3))
    """
    d_model = check_positive_int(d_model, "d_model")
    d_q = check_positive_int(d_q, "d_q")
    d_k = check_positive_int(d_k, "d_k")
    d_v = check_positive_int(d_v, "d_v")
    if d_q != d_k:
        raise AttnlabError(
            f"d_q, d_k: expected equal widths (scores are Q @ K.T), got d_q={d_q}, d_k={d_k}"
        )
    v_gain = _check_scale(v_gain, "v_gain")
    scheme = _check_scheme(scheme)
    _check_scale(gain, "gain")
    _check_scale(std, "std")
    generator = as_rng(rng)
    w_q = init_weight(d_model, d_q, scheme, rng=generator, gain=gain, std=std)  # (E, d_q)
    w_k = init_weight(d_model, d_k, scheme, rng=generator, gain=gain, std=std)  # (E, d_k)
    w_v = init_weight(d_model, d_v, scheme, rng=generator, gain=gain, std=std)  # (E, d_v)
    return w_q, w_k, v_gain * w_v
