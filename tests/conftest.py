"""Settings for the whole suite, made once here rather than in each test file.

- torch's thread count: ``ATTNLAB_TEST_TORCH_THREADS`` (default 1), when torch is
  installed. scripts/test-numerics.sh runs the numerics tiers at 1 and at 2 threads.
  Every test starts at that count, whatever a test module set for itself, and a test
  that changes it must put it back (checked after every test).
- NumPy's BLAS is left as the environment sets it (``OPENBLAS_CORETYPE``,
  ``OPENBLAS_NUM_THREADS``); the report header names the kernel and thread counts
  the run really used.
- Tests under tests/core, tests/torch, tests/models and tests/conformance get the
  ``numerics`` marker: their results depend on the BLAS kernel and the thread
  counts, so ``pytest -m numerics`` selects them.

- Parallel runs: ``make test`` runs ``-n 2 --dist loadfile`` (pytest-xdist), so a test
  file stays in one worker and its module-scoped fixtures (a loaded model, spawned
  ranks, a Chromium) are built once; tests/docs/conftest.py shares one site build
  between the workers. Each worker is a pytest process of its own: the torch thread
  count below is set in each.

- tests/hf (attnlab inside Hugging Face models) compares torch with torch, so it is
  not a numerics tier; its own conftest sets the hub offline and registers attnlab.

Nothing here needs more than NumPy and pytest: tests/core runs without torch.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

THREADS_VARIABLE = "ATTNLAB_TEST_TORCH_THREADS"
CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium tries to reach Google's hosts at start.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
NUMERICS_TIERS = ("core", "torch", "models", "conformance")
TESTS = Path(__file__).resolve().parent


def _wanted_torch_threads() -> int:
    raw = os.environ.get(THREADS_VARIABLE, "1")
    if not raw.strip().isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"{THREADS_VARIABLE}: expected an integer >= 1, got {raw!r}")
    return int(raw)


@functools.cache
def _torch():  # -> the torch module, or None where it is not installed
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:  # origin None: a namespace package, not torch
        return None
    import torch

    return torch


def pytest_configure(config: pytest.Config) -> None:
    wanted = _wanted_torch_threads()  # a bad value stops the run here, torch or not
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(wanted)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [_blas_line(), _torch_line()]


def _blas_line() -> str:
    import numpy as np

    np.ones((2, 2)) @ np.ones((2, 2))  # make sure the BLAS library is loaded
    coretype = os.environ.get("OPENBLAS_CORETYPE", "unset")
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"BLAS: kernel unknown (threadpoolctl not installed), OPENBLAS_CORETYPE={coretype}"
    blas = [info for info in threadpool_info() if info["user_api"] == "blas"]
    if not blas:
        return f"BLAS: none found by threadpoolctl, OPENBLAS_CORETYPE={coretype}"
    described = ", ".join(
        f"{info['internal_api']} {info.get('version')} kernel {info.get('architecture')}"
        f", {info['num_threads']} thread(s)"
        for info in blas
    )
    return f"BLAS: {described} (OPENBLAS_CORETYPE={coretype})"


def _torch_line() -> str:
    torch = _torch()
    if torch is None:
        return "torch: not installed"
    return (f"torch: {torch.__version__}, {torch.get_num_threads()} thread(s) "
            f"({THREADS_VARIABLE}={os.environ.get(THREADS_VARIABLE, 'unset, so 1')})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    numerics = {TESTS / tier for tier in NUMERICS_TIERS}
    for item in items:
        if numerics.intersection(Path(item.path).resolve().parents):
            item.add_marker(pytest.mark.numerics)


@pytest.fixture(autouse=True)
def _torch_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test starts at the configured count (a test module, or a module-scoped
    fixture, may have set its own) and must leave it so."""
    torch = _torch()
    if torch is None:
        yield
        return
    wanted = _wanted_torch_threads()
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    yield
    now = torch.get_num_threads()
    if now != wanted:
        torch.set_num_threads(wanted)  # so that the tests after this one still run as asked
        pytest.fail(f"{request.node.nodeid} left torch at {now} threads instead of {wanted}; "
                    "a test that changes the thread count must restore it")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium through Playwright, for the viewer's and the site's browser tests."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: .venv/bin/pip install playwright")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}; install it with "
            "`bash scripts/install-system-deps.sh` (Debian: apt-get install chromium "
            "chromium-driver) or set ATTNLAB_CHROMIUM to a Chromium binary"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()
