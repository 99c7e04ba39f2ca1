"""mkdocs hooks for attnlab's documentation site (named in mkdocs.yml).

- The tutorial: each language's navigation and lesson list is made from the notebooks
  in docs/tutorial/<lang>/ at build time (whatever notebooks are there), and each
  language's site holds only its own notebooks.
- The tutorial's outputs: a notebook is executed by scripts/executed_notebooks.py, which
  keeps the result for tests/tutorial (and reads the result those tests kept), so
  ``make test`` runs each notebook once; mkdocs-jupyter then renders the executed copy.
- The command line: ``<!-- attnlab-cli-help -->`` in cli.md / cli.zh.md becomes every
  command's ``--help``, produced by attnlab's own argparse parsers (in Chinese on the
  Chinese page, as ``--lang zh`` gives it), so the page cannot drift from the parsers.
- Offline: any ``<script src>`` or stylesheet ``<link>`` pointing off the site is
  removed from every page (nbconvert adds MathJax and Mermaid from a CDN; the
  notebooks use neither), and a test checks no page requests anything remote. The
  head's ``<link rel="alternate" hreflang>`` tags go too: material's script fetches a
  ``sitemap.xml`` beside each (it expects them to point at a language's root; here
  they point at the page itself, so each fetch is a 404). The language switch in the
  header keeps its links to the same page in the other language.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import posixpath
import re
import tempfile
from pathlib import Path

import executed_notebooks  # scripts/executed_notebooks.py (mkdocs puts scripts/ on the path)
import nbformat
from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial"
LANGS = ("en", "zh")
CLI_MARKER = "<!-- attnlab-cli-help -->"
LESSONS_MARKER = "<!-- attnlab-tutorial-lessons -->"
SOLUTIONS_TITLE = {"en": "Solutions", "zh": "参考答案"}
REMOTE = re.compile(
    r"<script\b[^>]*\bsrc=[\"']?(?:https?:)?//[^>]*>\s*</script>"
    r"|<link\b[^>]*\bhref=[\"']?(?:https?:)?//[^>]*>"
    r"|<link\b[^>]*\brel=[\"']?alternate[\"']?[^>]*\bhreflang=[^>]*>", re.I)


def _language(config) -> str:
    plugin = config.plugins.get("i18n")
    lang = getattr(plugin, "current_language", None) if plugin else None
    return lang if lang in LANGS else "en"


def _notebooks(lang: str) -> list[Path]:
    return sorted((TUTORIAL / lang).glob("*.ipynb"))


def _solutions(lang: str) -> list[Path]:
    return sorted((TUTORIAL / lang / "solutions").glob("*.ipynb"))


def _notebook_title(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem.replace("_", " ")


_NAV: list = []


def _render_executed(nb2html):
    """mkdocs-jupyter's nb2html, given a tutorial notebook to execute, renders the copy
    scripts/executed_notebooks.py executed (or had kept) instead of executing it again."""

    def render(nb_path, *args, execute=False, **kwargs):
        if not (execute and executed_notebooks.is_tutorial(Path(nb_path))):
            return nb2html(nb_path, *args, execute=execute, **kwargs)
        notebook = executed_notebooks.executed(Path(nb_path))
        with tempfile.TemporaryDirectory(prefix="attnlab-notebook-") as folder:
            copy = Path(folder) / Path(nb_path).name
            nbformat.write(notebook, copy)
            return nb2html(str(copy), *args, execute=False, **kwargs)

    render.attnlab_executed = True
    return render


def on_config(config, **kwargs):
    """Put this language's notebooks under the tutorial entry of the navigation (the
    navigation as written is kept, since every language's build starts from it)."""
    from mkdocs_jupyter import convert

    if not getattr(convert.nb2html, "attnlab_executed", False):
        convert.nb2html = _render_executed(convert.nb2html)
    if not _NAV:
        _NAV.append(copy.deepcopy(config.nav))
    config.nav = copy.deepcopy(_NAV[0])
    lang = _language(config)
    entries: list = [{_notebook_title(p): p.relative_to(TUTORIAL.parent).as_posix()}
                     for p in _notebooks(lang)]
    solutions = [{_notebook_title(p): p.relative_to(TUTORIAL.parent).as_posix()}
                 for p in _solutions(lang)]
    if solutions:
        entries.append({SOLUTIONS_TITLE[lang]: solutions})

    def fill(items):
        for item in items or []:
            if isinstance(item, dict):
                for key, value in item.items():
                    if value == "tutorial-notebooks":
                        item[key] = entries
                    elif isinstance(value, list):
                        fill(value)

    fill(config.nav)
    return config


@event_priority(-200)
def on_files(files, config, **kwargs):
    """Drop the other language's notebooks (lessons and solutions) from this language's
    site, and make this language's notebooks pages again: the i18n plugin (at priority
    -100) turns mkdocs-jupyter's notebook pages back into plain files it would copy."""
    lang = _language(config)
    for file in list(files):  # tutorial/<lang>/*.ipynb and tutorial/<lang>/solutions/*.ipynb
        parts = Path(file.src_uri).parts
        notebook = parts[-1].endswith(".ipynb") and (
            len(parts) == 3 or (len(parts) == 4 and parts[2] == "solutions"))
        if notebook and parts[0] == "tutorial" and parts[1] in LANGS:
            files.remove(file)
            if parts[1] == lang:
                files.append(_JUPYTER_FILE(file, **config))
    return files


def _JUPYTER_FILE(file, **config):  # noqa: N802 (a class, imported late)
    from mkdocs_jupyter.plugin import NotebookFile

    return NotebookFile(file, **config)


@event_priority(100)
def on_post_build(config, **kwargs):
    """Keep every language's executed notebooks in mkdocs-jupyter's cache: it evicts
    what the build just finished did not use, and each language's build uses only its
    own notebooks."""
    plugin = config.plugins.get("mkdocs-jupyter")
    if plugin is None or not plugin.config.get("cache"):
        return
    from mkdocs_jupyter import plugin as jupyter

    for lang in LANGS:
        for path in [*_notebooks(lang), *_solutions(lang)]:
            key = jupyter._compute_cache_key(str(path), plugin.config, plugin.config["execute"])
            plugin._used_cache_paths.add(jupyter._get_cache_path(plugin.config["cache_dir"], key))


def _cli_help(lang: str) -> str:
    from attnlab.cli.app import COMMANDS, main

    def run(argv: list[str]) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(argv)
        return out.getvalue().rstrip()

    extra = ["--lang", "zh"] if lang == "zh" else []
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "92"
    try:
        parts = [f"### `attnlab`\n\n```text\n{run(['--help', *extra])}\n```\n"]
        for name in COMMANDS:
            parts.append(f"### `attnlab {name}`\n\n```text\n{run([name, '--help', *extra])}\n```\n")
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def _lessons(lang: str, page_src: str) -> str:
    prefix = "../" * (len(Path(page_src).parts) - 1)
    lines = [f"{i}. [{_notebook_title(p)}]({prefix}tutorial/{lang}/{p.name})"
             for i, p in enumerate(_notebooks(lang), start=1)]
    solutions = [f"[{_notebook_title(p)}]({prefix}tutorial/{lang}/solutions/{p.name})"
                 for p in _solutions(lang)]
    if solutions:
        lines += ["", f"{SOLUTIONS_TITLE[lang]}: " + " · ".join(solutions)]
    return "\n".join(lines)


ZH_SCHEME = "attnlab-zh:"
ZH_LINK = re.compile(r"\]\(([^)\s#]+)\.zh\.md(#[^)\s]*)?\)")


def _zh_links(markdown: str, page_src: str) -> str:
    """On an English page, a link to ``X.zh.md`` (how a page points at its Chinese twin
    for readers of the Markdown files) goes to the Chinese site's page for X."""
    folder = posixpath.dirname(page_src)
    up = "../" * len(Path(page_src).parts[:-1])

    def to_zh(match: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(folder, match.group(1)))
        # A scheme keeps mkdocs from checking it as a page of this (English) build;
        # on_page_content makes it relative again.
        return f"]({ZH_SCHEME}{up}zh/{target}.html{match.group(2) or ''})"

    return ZH_LINK.sub(to_zh, markdown)


def on_page_content(html, page, config, files, **kwargs):
    return html.replace(f'href="{ZH_SCHEME}', 'href="')


def on_page_markdown(markdown, page, config, files, **kwargs):
    lang = _language(config)
    if lang == "en":
        markdown = _zh_links(markdown, page.file.src_uri)
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, _cli_help(lang))
    if LESSONS_MARKER in markdown:
        markdown = markdown.replace(LESSONS_MARKER, _lessons(lang, page.file.src_uri))
    return markdown


def on_post_page(output, page, config, **kwargs):
    return REMOTE.sub("", output)
