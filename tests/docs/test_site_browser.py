"""The built documentation site in a real browser: Debian's headless Chromium, driven by
Playwright (as tests/browser does; a missing browser fails, it does not skip).

The site is served from a local HTTP server on 127.0.0.1; every request the pages make,
the search worker's included, is recorded, and any request to another host is aborted
and fails the test: the site must be whole offline (no fonts, scripts or styles from a
CDN, the search index local).
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TIMEOUT_MS = 15000


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass


@pytest.fixture(scope="module")
def origin(site: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class SitePage:
    """One browser context on the local site; records every request and every failure."""

    def __init__(self, browser: Any, origin: str) -> None:
        self.origin = origin
        self.requests: list[str] = []
        self.remote: list[str] = []
        self.failed: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.route("**/*", self._route)
        self.context.on("request", lambda request: self.requests.append(request.url))
        # A request cut short by moving to the next page (net::ERR_ABORTED) is not a failure.
        self.context.on("requestfailed", lambda request: self.failed.append(request.url)
                        if "ERR_ABORTED" not in (request.failure or "") else None)
        self.context.on("response", lambda response: self.failed.append(response.url)
                        if response.status >= 400 else None)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("console", lambda msg: self.errors.append(msg.text)
                     if msg.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))

    def _route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(self.origin + "/") or url.startswith("data:"):
            route.continue_()
        else:
            self.remote.append(url)
            route.abort()

    def open(self, path: str) -> Any:
        self.page.goto(f"{self.origin}/{path}")
        self.page.wait_for_load_state("load")
        return self.page

    def assert_stayed_local(self) -> None:
        assert self.remote == [], f"requests left the machine: {self.remote}"
        leaving = [u for u in self.requests
                   if not (u.startswith(self.origin + "/") or u.startswith("data:"))]
        assert leaving == [], f"requests left the machine: {leaving}"
        assert self.failed == [], f"requests that failed: {self.failed}"


@pytest.fixture
def visit(browser: Any, origin: str) -> Iterator[SitePage]:
    page = SitePage(browser, origin)
    yield page
    page.context.close()


def _pages(site: Path) -> list[str]:
    """Every guide page in both languages, the first API page and a tutorial lesson."""
    guides = sorted(p.name for p in site.glob("*.html") if p.name != "404.html")
    lessons = sorted(p.relative_to(site).as_posix() for p in site.glob("tutorial/*/*.html"))
    return [*guides, *(f"zh/{name}" for name in guides), "api/core.html", "zh/api/core.html",
            lessons[0], lessons[-1]]


def test_pages_open_with_no_request_leaving_the_machine(site, visit) -> None:
    pages = _pages(site)
    assert len(pages) > 30
    for path in pages:
        page = visit.open(path)
        assert page.locator("article h1").count() >= 1, f"{path}: no title"
    visit.assert_stayed_local()
    assert visit.errors == []
    assert any(u.endswith(".js") for u in visit.requests)  # the theme's own script, locally


def test_language_switch_goes_to_the_same_page_in_the_other_language(visit) -> None:
    page = visit.open("core.html")
    assert page.get_attribute("html", "lang") == "en"
    page.locator(".md-header__option .md-select").hover()
    page.locator("a.md-select__link[hreflang='zh']").click()
    page.wait_for_url("**/zh/core.html")
    assert page.get_attribute("html", "lang") == "zh"
    assert "NumPy 核心" in page.locator("article h1").inner_text()
    page.locator(".md-header__option .md-select").hover()
    page.locator("a.md-select__link[hreflang='en']").click()
    page.wait_for_url("**/core.html")
    assert page.get_attribute("html", "lang") == "en"
    assert page.locator("article h1").inner_text().startswith("The NumPy core")
    visit.assert_stayed_local()


@pytest.mark.parametrize("start,query,expect", [
    ("index.html", "softmax", "softmax"),
    ("zh/index.html", "注意力", "注意力"),
])
def test_search_finds_words_in_either_language(visit, start, query, expect) -> None:
    page = visit.open(start)
    page.locator("label.md-search__icon, .md-search__input").first.click()
    page.locator("input.md-search__input").fill(query)
    results = page.locator(".md-search-result__item")
    results.first.wait_for()
    assert results.count() >= 1
    assert expect in page.locator(".md-search-result__list").inner_text()
    visit.assert_stayed_local()


def test_api_page_shows_the_signature_of_scaled_dot_product_attention(visit) -> None:
    page = visit.open("api/core.html")
    heading = page.locator("[id='attnlab.scaled_dot_product_attention']")
    assert heading.count() == 1
    entry = page.locator("div.doc-function", has=heading)
    signature = entry.locator(".doc-signature").first.inner_text()
    for part in ("scaled_dot_product_attention(", "q", "mask", "is_causal", "return_weights",
                 "causal_alignment"):
        assert part in signature, f"{part!r} not in the rendered signature"
    assert "(..., T, S)" in entry.inner_text()  # the shapes from the docstring
    visit.assert_stayed_local()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_tutorial_lesson_shows_its_plot(site, visit, lang) -> None:
    lessons = sorted((site / "tutorial" / lang).glob("*heatmap*.html"))
    assert lessons, f"no heatmap lesson in tutorial/{lang}"
    page = visit.open(lessons[0].relative_to(site).as_posix())
    plot = page.locator(".jp-OutputArea-output img").first
    plot.scroll_into_view_if_needed()
    assert plot.is_visible()
    width = plot.evaluate("img => img.complete ? img.naturalWidth : 0")
    assert width > 200, f"the lesson's plot did not render (width {width})"
    assert page.get_attribute("html", "lang") == lang
    visit.assert_stayed_local()


def test_pages_open_from_disk_with_nothing_fetched_from_the_network(site, browser) -> None:
    """Opened as files (file://), a page draws with the theme's local script and style."""
    context = browser.new_context()
    remote: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith(("file://", "data:")):
            r.continue_()
        else:
            remote.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    try:
        for path in ("index.html", "zh/core.html", "api/core.html"):
            page.goto((site / path).resolve().as_uri())
            page.wait_for_load_state("load")
            assert page.locator("article h1").count() >= 1
            # The theme's stylesheet applied: the header is laid out as material lays it.
            assert page.locator("header.md-header").evaluate(
                "h => getComputedStyle(h).position") in ("sticky", "fixed")
    finally:
        context.close()
    assert remote == [], f"requests left the machine: {remote}"
