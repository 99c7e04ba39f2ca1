"""Gradient norms and flags from the NumPy backward (torch side: test_grad_diagnostics_torch)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnlab import AttnlabError, MultiHeadAttention
from attnlab.lens.grad_diagnostics import (
    DEFAULT_EXPLODE_ABOVE,
    DEFAULT_VANISH_BELOW,
    GradReport,
    grad_norms,
)


@pytest.fixture
def setup():
    rng = np.random.default_rng(0)
    mha = MultiHeadAttention.init(4, 8, seed=1)
    mha.bq, mha.bv, mha.bo = rng.standard_normal(8), rng.standard_normal(8), rng.standard_normal(8)
    x = rng.standard_normal((2, 5, 8))
    G = rng.standard_normal((2, 5, 8))
    return mha, x, G


# --------------------------------------------------------------------------- NumPy


def test_numpy_report_names_shapes_and_the_inert_key_bias(setup):
    mha, x, G = setup
    report = grad_norms(mha, x, G)
    assert list(report.norms) == ["Wq", "Wk", "Wv", "Wo", "bq", "bk", "bv", "bo"]
    assert sorted(report.head_norms) == ["Wk", "Wo", "Wq", "Wv", "bk", "bq", "bv"]
    assert all(h.shape == (4,) for h in report.head_norms.values())
    # Heads partition each parameter: the head norms add up (in squares) to the whole.
    for name, heads in report.head_norms.items():
        assert math.isclose(float(np.sum(heads**2)), report.norms[name] ** 2, rel_tol=1e-12)
    assert report.output_norm == pytest.approx(float(np.linalg.norm(G)))
    # The key bias never gets a gradient (softmax ignores a per-row constant): said so,
    # not flagged as vanishing; nothing else is flagged.
    assert report.flags() == {"bk": "zero_by_design",
                              **{f"bk[head {h}]": "zero_by_design" for h in range(4)}}
    assert report.norms["bk"] < 1e-12 and not report.vanishing and report.healthy
    assert any("0 by design" in line for line in report.lines() if line.startswith("bk "))


def test_dout_may_be_a_callable_of_the_output(setup):
    mha, x, _ = setup
    target = np.ones((2, 5, 8))
    from_callable = grad_norms(mha, x, lambda out: out - target)
    from_array = grad_norms(mha, x, mha(x)[0] - target)
    assert from_callable.norms == from_array.norms


def test_gqa_heads_are_split_by_kv_head(setup):
    _, x, G = setup
    mha = MultiHeadAttention.init(4, 8, num_kv_heads=2, seed=3)
    report = grad_norms(mha, x, G)
    assert report.head_norms["Wq"].shape == (4,) and report.head_norms["Wo"].shape == (4,)
    assert report.head_norms["Wk"].shape == (2,) and report.head_norms["Wv"].shape == (2,)


def test_flags_vanishing_exploding_and_thresholds(setup):
    mha, x, G = setup
    silent = grad_norms(mha, x, np.zeros_like(G))
    assert set(silent.vanishing) >= set(silent.norms) - {"bk"} and not silent.exploding
    assert silent.flags()["bk"] == "zero_by_design"
    loud = grad_norms(mha, x, G * 1e6)
    assert "Wo" in loud.exploding and "Wo[head 0]" in loud.exploding
    relaxed = grad_norms(mha, x, G * 1e6, explode_above=1e12, vanish_below=0.0)
    assert relaxed.healthy
    assert (DEFAULT_VANISH_BELOW, DEFAULT_EXPLODE_ABOVE) == (1e-7, 1e3)
    report = GradReport({"a": float("nan"), "b": 1.0, "c": 1e-8, "d": 1e4})
    assert report.flags() == {"a": "nonfinite", "c": "vanishing", "d": "exploding"}
    assert report.lines()[0].startswith("a") and report.lines()[0].endswith("nonfinite")
    with pytest.raises(AttnlabError, match="vanish_below, explode_above"):
        GradReport({"a": 1.0}, vanish_below=1.0, explode_above=0.5)
    with pytest.raises(AttnlabError, match="explode_above: expected a number"):
        grad_norms(mha, x, G, explode_above="big")
