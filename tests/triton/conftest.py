"""The Triton tier: attnlab.triton's GPU kernels, run on the CPU by Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before triton is first imported (``triton.jit``
reads it when it decorates a function: triton's own helpers such as ``tl.zeros``
when triton is imported, attnlab's kernels when :mod:`attnlab.triton` is).

- Run alone (``pytest tests/triton``), nothing has imported triton yet: the
  variable is set here, while pytest collects this folder, and again around each
  test (the interpreter reads it at every call of a kernel's helper functions);
  it is put back in between, so nothing outside the tier sees it.
- In the whole suite, an earlier tier has already imported triton (``import
  torch._dynamo`` does, wherever triton is installed), with its helpers built for
  a GPU. The tier's files are then not collected here; the one test of
  ``test_tier_in_a_fresh_process.py`` runs them in a fresh interpreter, as above,
  and fails with their report if any of them fails.

Tile sizes under the interpreter are 32 × 32 (attnlab.triton.flash), so the
shapes here (T, S <= 256) cover several tiles per row, ragged last tiles and
the causal diagonal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

#: True: this process runs the tier itself; False: a fresh one does.
IN_THIS_PROCESS = "triton" not in sys.modules
TIER_FILES = sorted(path.name for path in Path(__file__).parent.glob("test_triton_*.py"))

if IN_THIS_PROCESS:
    collect_ignore = ["test_tier_in_a_fresh_process.py"]
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        pytest.importorskip("triton", reason="triton is not installed (extra attnlab[triton])")
        from triton.language import standard as _triton_standard

        import attnlab.triton as _at
    finally:
        if _saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _saved
    if not (_at.interpreting() and type(_triton_standard.zeros).__name__
            == "InterpretedFunction"):
        raise pytest.UsageError(
            "attnlab.triton's kernels or triton's helpers are built for a GPU although "
            "TRITON_INTERPRET=1 was set before triton was imported"
        )
else:
    collect_ignore = TIER_FILES


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
