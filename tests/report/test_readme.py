"""The README's Python examples run as written (in a scratch folder)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    assert (tmp_path / "out" / "trace.json").is_file()
    assert namespace["emb"].shape == (2, 384)


def test_chinese_readme_python_blocks_run(tmp_path, monkeypatch):
    readme = README.with_name("README.zh.md")
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(encoding="utf-8"), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(readme), "exec"), namespace)  # noqa: S102
    assert namespace["layer"].output.shape == (3, 4)
    assert "README.zh.md" in README.read_text(encoding="utf-8").split("\n## ")[0]
