"""The built documentation site, for tests/docs.

``make test`` builds the site first (``make docs``) and passes its folder in
ATTNLAB_DOCS_SITE; run alone, these tests build it themselves, strictly, into a
temporary folder (the tutorial notebooks' outputs come from the build's cache when
it has them, else the build executes them: about a minute). Under pytest-xdist the
workers share one build: the first to need it builds it, under a lock, into the run's
common temporary folder, and the others wait for it and read it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent  # common to this run's workers
        with open(shared / "site.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
            folder = shared / "site"
            if not folder.is_dir():  # renamed into place only once built: never half a site
                building = shared / "site-building"
                shutil.rmtree(building, ignore_errors=True)
                _build(building)
                building.rename(folder)
        return folder
    folder = tmp_path_factory.mktemp("site")
    _build(folder)
    return folder


def _build(folder: Path) -> None:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
         str(folder)], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}")
