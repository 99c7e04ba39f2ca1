"""The README's Python example runs as written (in a scratch folder); the README stays a
landing page. The examples that used to be here run from the documentation pages they
moved to (tests/docs/test_examples.py)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MAX_LINES = 200


def _blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = _blocks(README)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    assert (tmp_path / "out" / "trace.json").is_file()
    assert namespace["out"].shape == (3, 3)


def test_chinese_readme_python_blocks_run(tmp_path, monkeypatch):
    readme = README.with_name("README.zh.md")
    blocks = _blocks(readme)
    assert blocks
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(readme), "exec"), namespace)  # noqa: S102
    assert namespace["layer"].output.shape == (3, 4)
    assert "README.zh.md" in README.read_text(encoding="utf-8").split("\n## ")[0]


def test_readmes_are_landing_pages():
    for path in (README, README.with_name("README.zh.md")):
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= MAX_LINES, f"{path.name} is over {MAX_LINES} lines"
        # The two commands stay at the top, as they are.
        assert "make demo" in text.split("\n## ")[0] and "make test" in text.split("\n## ")[0]
        # No load-dependent timing figure: those live on docs/measurements.md.
        timings = re.findall(r"\d+(?:\.\d+)?\s?(?:ms|µs|s)\b|\d+(?:\.\d+)?×", text)
        assert not timings, f"{path.name} quotes timings {timings}: move them to measurements"


def test_readme_links_resolve():
    for path in (README, README.with_name("README.zh.md")):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" not in target:
                assert (path.parent / target).exists(), f"{path.name} links to missing {target}"
