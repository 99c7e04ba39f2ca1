"""attnlab.init against torch.nn.init (the NumPy-only tests are in tests/core/test_init.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab.init import xavier_uniform

FAN_IN, FAN_OUT = 400, 600  # 240,000 draws, as in tests/core/test_init.py: checks are ~5 sigma


def test_xavier_uniform_agrees_with_torch_statistics() -> None:
    # torch stores Linear weights as (fan_out, fan_in); its bound must equal ours.
    generator = torch.Generator().manual_seed(0)
    torch_weights = torch.nn.init.xavier_uniform_(
        torch.empty(FAN_OUT, FAN_IN, dtype=torch.float64), generator=generator
    ).numpy()
    ours = xavier_uniform(FAN_IN, FAN_OUT, rng=1)
    # Both maxima are within 0.1% of the common bound (see the test above), so 0.2% apart.
    assert np.abs(ours).max() == pytest.approx(np.abs(torch_weights).max(), rel=2e-3)
    # Two independent sample variances, each 0.18% relative std: 1.5% is ~6 sigma.
    assert ours.var() == pytest.approx(torch_weights.var(), rel=0.015)

