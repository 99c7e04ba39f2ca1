"""Every Python example on the documentation pages runs as written (in a scratch folder).

The examples used to live in the README; they moved with the sections they illustrate,
and so did the checks on what they produce. Each page's ```python blocks run in order in
one namespace (as a reader would paste them); ```py blocks are fragments that need
what a test cannot have (several distributed ranks, a model folder of the reader's
own) and are not run here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md"))
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def run_blocks(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {"__name__": "__docs__"}
    for block in python_blocks(path):
        exec(compile(block, str(path), "exec"), namespace)  # noqa: S102
    return namespace


#: What some pages' examples must leave behind, beyond running without an error.
EXPECTED = {
    "core.md": lambda ns, tmp: (tmp / "out" / "trace.json").is_file(),
    "core.zh.md": lambda ns, tmp: (tmp / "out" / "trace.json").is_file(),
    "models.md": lambda ns, tmp: ns["emb"].shape == (2, 384),
    "models.zh.md": lambda ns, tmp: ns["emb"].shape == (2, 384),
    "getting-started.md": lambda ns, tmp: ns["out"].shape == (3, 3),
    "getting-started.zh.md": lambda ns, tmp: ns["out"].shape == (3, 3),
}


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)], ids=lambda p: p.name)
def test_page_examples_run(page, tmp_path, monkeypatch):
    namespace = run_blocks(page, tmp_path, monkeypatch)
    check = EXPECTED.get(page.name)
    if check is not None:
        assert check(namespace, tmp_path), f"{page.name}: the example's result changed"


def test_pages_have_examples_where_the_readme_had_them():
    """The README's examples moved to these pages: none may lose them silently."""
    for name in ("core.md", "torch.md", "models.md", "lens.md", "fast.md", "kernel.md",
                 "distributed.md", "training.md"):
        assert python_blocks(DOCS / name), f"{name} has no Python example"
