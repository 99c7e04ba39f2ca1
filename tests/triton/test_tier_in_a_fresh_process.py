"""The Triton tier in a fresh interpreter, for runs where triton was imported before the
tier's conftest could set TRITON_INTERPRET=1 (the whole suite: see conftest.py).

Collected only in such runs; run alone, the tier's files are collected directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TIER = Path(__file__).resolve().parent
ROOT = TIER.parents[1]


def test_the_triton_tier_passes_in_a_fresh_process():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(TIER), "-q", "-ra", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    report = result.stdout[-12000:] + result.stderr[-4000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and "skipped" not in result.stdout, report
