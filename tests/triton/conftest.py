"""The Triton tier: attnlab.triton's GPU kernels, run on the CPU by Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before the kernels are defined (``triton.jit``
reads it when it decorates them), so it is set here, while pytest collects this
folder and before any test module imports :mod:`attnlab.triton`, and again around
each test of the tier (the interpreter reads it at every call of a kernel's helper
functions too); it is put back in between, so the other tiers run as they would
alone. If
:mod:`attnlab.triton` was already imported without it (by a module collected
earlier), the tier stops with an error rather than trying a GPU.

Tile sizes under the interpreter are 32 × 32 (attnlab.triton.flash), so the
shapes here (T, S <= 256) cover several tiles per row, ragged last tiles and
the causal diagonal.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

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

# triton.language's own helpers (tl.zeros, ...) are decorated when triton is first
# imported, attnlab's kernels when attnlab.triton is: both must have seen the variable.
if not (_at.interpreting() and type(_triton_standard.zeros).__name__
        == "InterpretedFunction"):
    raise pytest.UsageError(
        "triton or attnlab.triton was imported before tests/triton/conftest.py could set "
        "TRITON_INTERPRET=1, so their kernels are built for a GPU: run this tier on its own "
        "or find what imports triton first"
    )


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
