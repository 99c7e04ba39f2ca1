"""The built documentation site, for tests/docs.

``make test`` builds the site first (``make docs``) and passes its folder in
ATTNLAB_DOCS_SITE; run alone, these tests build it themselves, strictly, into a
temporary folder (the tutorial notebooks' outputs come from the build's cache when
it has them, else the build executes them: about a minute).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("ATTNLAB_DOCS_SITE")
    if given:
        folder = (ROOT / given).resolve()
        if not (folder / "index.html").is_file():
            pytest.fail(f"ATTNLAB_DOCS_SITE={given}: no built site there (run `make docs`)")
        return folder
    folder = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
         str(folder)], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}")
    return folder
