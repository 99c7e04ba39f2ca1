"""The tutorial notebooks executed once for their two readers: the documentation build
(scripts/docs_hooks.py renders the outputs) and tests/tutorial (which checks them).

A notebook runs in this interpreter (``sys.executable``), through a kernel spec written
to a temporary Jupyter path, so no kernel installed on the machine (a user's
"python3") is picked up instead; each cell has ``TIMEOUT`` seconds. The executed
notebook is kept in ``.cache/executed-notebooks/`` under a key made of everything its
outputs depend on:

- the notebook's bytes and its path in docs/tutorial/;
- every file of the attnlab package the kernel imports (found by asking a fresh
  process started as the kernel is: same interpreter, environment and folder);
- the interpreter, its version, and every installed distribution with its version;
- the environment variables that change imports or numerics (``KEY_ENVIRONMENT``);
- this file (how a notebook is executed).

Whichever of ``make docs`` and the tests runs a notebook first executes it; the other
reads the result. Any change to those inputs is a new key, so a result made from
other inputs is never read. A run that ended in an error is not kept: the next
reader executes the notebook again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial"
CACHE = ROOT / ".cache" / "executed-notebooks"
KERNEL = "attnlab-tutorial"
TIMEOUT = 120  # seconds per cell
KEY_ENVIRONMENT = ("PYTHONPATH", "PYTHONHOME", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS",
                   "OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATTNLAB_LANG", "LANG", "LC_ALL")


def is_tutorial(path: Path) -> bool:
    return Path(path).resolve().is_relative_to(TUTORIAL) and Path(path).suffix == ".ipynb"


def executed(path: Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` (under docs/tutorial/) with its outputs: read from the
    cache, or executed now and then kept there."""
    path = Path(path).resolve()
    folder = CACHE / path.relative_to(TUTORIAL).with_suffix("")
    kept = folder / f"{_key(path)}.ipynb"
    if kept.is_file():
        return nbformat.read(kept, as_version=4)
    notebook = nbformat.read(path, as_version=4)
    with _kernel_spec():
        client = nbclient.NotebookClient(notebook, kernel_name=KERNEL, timeout=TIMEOUT,
                                         allow_errors=True,
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    if not errors(notebook):
        # Written aside, then renamed, so a reader never sees half a file; then the older
        # results of this notebook go. Another process may be writing or reading the same
        # folder (xdist workers, a docs build): only finished files other than this one are
        # removed, and one already gone is no error.
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{kept.name}.{os.getpid()}"
        nbformat.write(notebook, partial)
        os.replace(partial, kept)
        for old in folder.glob("*.ipynb"):
            if old != kept:
                old.unlink(missing_ok=True)
    return notebook


def errors(notebook: nbformat.NotebookNode) -> list[str]:
    """Each error output of the notebook, as its exception name and message."""
    return [f"{o.get('ename')}: {o.get('evalue')}" for cell in notebook.cells
            if cell.cell_type == "code" for o in cell.get("outputs", [])
            if o.get("output_type") == "error"]


@contextlib.contextmanager
def _kernel_spec() -> Iterator[None]:
    old = os.environ.get("JUPYTER_PATH")
    with tempfile.TemporaryDirectory(prefix="attnlab-jupyter-") as folder:
        spec = Path(folder) / "kernels" / KERNEL
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "attnlab (this interpreter)", "language": "python",
            "env": {"MPLBACKEND": "module://matplotlib_inline.backend_inline"},
        }))
        os.environ["JUPYTER_PATH"] = folder
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = old


def _key(path: Path) -> str:
    digest = hashlib.sha256()
    digest.update(path.relative_to(TUTORIAL).as_posix().encode())
    digest.update(path.read_bytes())
    digest.update(_kernel_digest(str(path.parent)).encode())
    digest.update(Path(__file__).read_bytes())
    for name in KEY_ENVIRONMENT:
        digest.update(f"{name}={os.environ.get(name)!r}".encode())
    return digest.hexdigest()[:32]


# Run where the kernel runs (this interpreter and environment, the notebook's folder):
# what it imports is what the kernel imports.
_KERNEL_SIDE = """import importlib.metadata, os, sys, attnlab
print(os.path.dirname(attnlab.__file__))
print(sys.executable, sys.version)
print(*sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()))
"""


@functools.cache
def _kernel_digest(folder: str) -> str:
    """The hash of the interpreter, the installed distributions and every file of the
    attnlab package, as a kernel started in ``folder`` sees them."""
    seen = subprocess.run([sys.executable, "-c", _KERNEL_SIDE], cwd=folder,
                          capture_output=True, text=True, check=True).stdout
    package = Path(seen.splitlines()[0])
    digest = hashlib.sha256(seen.encode())
    for file in sorted(package.rglob("*")):
        if file.is_file() and "__pycache__" not in file.parts:
            digest.update(file.relative_to(package).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()
