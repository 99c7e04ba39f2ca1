"""flash_attention(num_threads=n) holds NumPy's BLAS to one thread per worker while it
runs and restores it afterwards, also after an error. Needs threadpoolctl (the
``bench`` extra), so it lives beside the studies rather than in tests/core, whose
virtualenv has NumPy alone (there flash runs its parts one after another)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import threadpoolctl

from attnlab import flash_attention


def _problem_split_into_parts(dtype):
    """Batch (2, 3), T = S = 300: more scores than one part holds, so the forward
    splits the batch into parts; mask and v have fewer and size-1 batch dims."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 3, 300, 16)).astype(dtype)
    k = rng.standard_normal((2, 1, 300, 16)).astype(dtype)  # one k head shared by 3 q heads
    v = rng.standard_normal((3, 300, 8)).astype(dtype)
    mask = rng.random((2, 1, 1, 300)) < 0.8  # (B, 1, 1, S) key padding
    mask[1, ..., :] = False  # batch row 1: no key at all
    return q, k, v, mask


def _blas_threads():
    return [info["num_threads"] for info in threadpoolctl.threadpool_info()
            if info["user_api"] == "blas"]


@pytest.mark.parametrize("num_threads", [None, 1, 2])
def test_blas_threads_are_held_during_the_call_and_restored(monkeypatch, num_threads):
    tiles_module = importlib.import_module("attnlab.fast.flash_tiles")
    q, k, v, mask = _problem_split_into_parts(np.float32)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        seen = []
        online_softmax = tiles_module.online_softmax

        def spy(*args, **kwargs):
            seen.append(_blas_threads())
            return online_softmax(*args, **kwargs)

        monkeypatch.setattr(tiles_module, "online_softmax", spy)
        flash_attention(q, k, v, mask, num_threads=num_threads)
        assert seen and all(s == (before if num_threads is None else [1] * len(before))
                            for s in seen)
        assert _blas_threads() == before

        # An error in a part reaches the caller, and the setting is restored all the same.
        def failing(*args, **kwargs):
            raise RuntimeError("a part failed")

        monkeypatch.setattr(tiles_module, "online_softmax", failing)
        with pytest.raises(RuntimeError, match="a part failed"):
            flash_attention(q, k, v, mask, num_threads=num_threads)
        assert _blas_threads() == before
