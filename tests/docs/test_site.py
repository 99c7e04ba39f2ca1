"""The built site, read as files: every page in both languages, every public name in the
API reference, every command's help generated, nothing fetched from elsewhere.
(The browser checks are in test_site_browser.py.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "attnlab"

#: The packages whose ``__all__`` is the public API, and the API page that documents each.
API_PAGES = {
    "attnlab": "core", "attnlab.torch": "torch", "attnlab.torch.compat": "torch",
    "attnlab.torch.models": "torch", "attnlab.models": "models", "attnlab.lens": "lens",
    "attnlab.report": "report", "attnlab.distributed": "distributed",
    "attnlab.triton": "triton", "attnlab.train": "train", "attnlab.train.tasks": "train",
    "attnlab.fast.varlen": "fast", "attnlab.hf": "hf", "attnlab.exercises": "exercises",
    "attnlab.hooks": "lens",
}


def _all_names(module: str) -> list[str]:
    parts = module.split(".")[1:]
    path = SRC.joinpath(*parts)
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{module} has no __all__")


def _is_module(package: str, name: str) -> bool:
    """``attnlab.grad_diagnostics`` is a module exported by name: its functions are
    documented on the lens page."""
    import importlib

    return type(getattr(importlib.import_module(package), name, None)).__name__ == "module"


def test_every_page_has_a_chinese_twin():
    english = sorted(p for p in DOCS.rglob("*.md") if not p.name.endswith(".zh.md"))
    assert len(english) > 20
    missing = [str(p.relative_to(DOCS)) for p in english
               if not p.with_name(p.stem + ".zh.md").is_file()]
    assert missing == []


def test_chinese_pages_are_written_in_chinese():
    for page in DOCS.rglob("*.zh.md"):
        prose = re.sub(r"```.*?```|`[^`\n]*`|\|[^\n]*\|", "", page.read_text(encoding="utf-8"),
                       flags=re.S)
        han = len(re.findall(r"[\u4e00-\u9fff]", prose))
        assert han >= 10, f"{page.name}: {han} Chinese characters outside code and tables"


@pytest.mark.parametrize("module", sorted(API_PAGES))
def test_every_public_name_is_in_the_api_reference(site, module):
    for lang in ("", "zh/"):
        html = (site / f"{lang}api" / f"{API_PAGES[module]}.html").read_text(encoding="utf-8")
        # Names imported on first use are documented in their own module (any path).
        missing = [name for name in _all_names(module)
                   if not re.search(rf'id="attnlab[\w.]*\.{re.escape(name)}"', html)
                   and not _is_module(module, name)]
        assert missing == [], f"{lang}api/{API_PAGES[module]}.html lacks {missing}"


def test_the_cli_page_has_every_commands_help_from_the_parsers(site):
    from attnlab.cli.app import COMMANDS

    english = (site / "cli.html").read_text(encoding="utf-8")
    chinese = (site / "zh" / "cli.html").read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"usage: attnlab {name}" in english, name
        assert f"attnlab {name}" in chinese, name
    assert "--lang" in english
    # Chinese help, as `--help --lang zh` prints it (argparse's own words localised too).
    assert "用法" in chinese or "选项" in chinese


def test_no_page_loads_anything_from_another_host(site):
    remote = re.compile(r"<(?:script|img|iframe|source)\b[^>]*\bsrc=[\"']?(?:https?:)?//"
                        r"|<link\b[^>]*\bhref=[\"']?(?:https?:)?//|@import\s+url\([\"']?https?:"
                        r"|url\([\"']?https?://", re.I)
    pages = list(site.rglob("*.html")) + list(site.rglob("*.css"))
    assert len(pages) > 60
    offenders = [str(p.relative_to(site)) for p in pages
                 if remote.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert offenders == []
    assert (site / "search" / "search_index.json").is_file()


def test_measurements_page_gives_command_date_and_machine_for_each_figure():
    for name in ("measurements.md", "measurements.zh.md"):
        text = (DOCS / name).read_text(encoding="utf-8")
        rows = [r for r in text.splitlines() if r.startswith("| ") and "`" in r
                and ("×" in r or " ms" in r or " s " in r or "MiB" in r)]
        assert rows
        speed = text[text.index("| "):].split("\n\n")[0].splitlines()[2:]
        for row in speed:
            assert re.search(r"\| 20\d\d-\d\d-\d\d \|", row), f"{name}: no date in {row[:60]}"
            assert "`" in row, f"{name}: no command in {row[:60]}"
