"""The Hugging Face tier: attnlab registered in transformers, on the real MiniLM and on small
random models of eight architectures (tests/hf/tiny_models.py), offline."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # model hubs are never reached from the tests
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

pytest.importorskip("transformers", reason="the hf tier needs transformers (attnlab[hf])")


@pytest.fixture(scope="session", autouse=True)
def _registered():
    import transformers

    import attnlab.hf

    transformers.utils.logging.disable_progress_bar()
    attnlab.hf.register("attnlab")
    attnlab.hf.register("attnlab_plain", backend="plain")
    yield
