"""The viewer page in a real browser: Debian's headless Chromium, driven by Playwright.

Playwright's own browser download needs the network, so the tests use the system
Chromium at /usr/bin/chromium (``scripts/install-system-deps.sh`` installs it). A missing
browser or Playwright is a set-up error: the tests fail and say how to fix it, they do
not skip.

Every page is opened from disk with the network off: the context is offline and every
request other than the page file itself is aborted and recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnlab.lens.diagnostics import diagnose
from attnlab.report.viewer import AttentionView

CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
TOKENS = ["[CLS]", "小", "明", "去", "了", "学", "校", "[SEP]"]
INJECTED = '<img src=x onerror="window.__pwned = 1">'
SCRIPT_BREAK = "</script><script>window.__pwned = 2</script>"
TIMEOUT_MS = 5000
#: 16-bit codes per row max (viewer.encode_weights): a weight comes back within
#: row max / 131070 < 7.7e-6 of its value.
EXACT_ATOL = 1e-5


def weights_for_test() -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.dirichlet(np.full(len(TOKENS), 0.5), size=(2, 3, len(TOKENS)))  # (L, H, T, T)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the browser tests need Playwright: .venv/bin/pip install playwright")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}; install it with "
            "`bash scripts/install-system-deps.sh` (Debian: apt-get install chromium "
            "chromium-driver) or set ATTNLAB_CHROMIUM to a Chromium binary"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class OfflinePage:
    """A page in an offline context that records every request and console error."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.url = path.resolve().as_uri()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.context.set_offline(True)
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.on("console", lambda msg: self.errors.append(msg.text)
                     if msg.type == "error" else None)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(self.url)

    def _route(self, route: Any) -> None:
        if route.request.url == self.url:
            route.continue_()
        else:
            route.abort()

    def cell_values(self, size: int = len(TOKENS)) -> np.ndarray:
        """The weights the heatmap was painted from, as the page decoded them."""
        values = self.page.eval_on_selector("#attnlab-view", "root => root.attnlab.shown()")
        return np.reshape(values, (size, -1))

    def highlighted_rows(self, frame: Any = None) -> list[int]:
        return sorted(int(r) for r in (frame or self.page).eval_on_selector_all(
            "#heatmap-overlay .row-highlight", "rows => rows.map(r => r.dataset.row)"))

    def highlighted_columns(self) -> list[int]:
        return [int(c) for c in self.page.eval_on_selector_all(
            "#heatmap-overlay .col-highlight", "cols => cols.map(c => c.dataset.col)")]


@pytest.fixture
def open_page(browser: Any, tmp_path: Path) -> Iterator[Callable[..., OfflinePage]]:
    opened: list[OfflinePage] = []

    def _open(view_or_html: AttentionView | str) -> OfflinePage:
        path = tmp_path / f"page{len(opened)}.html"
        if isinstance(view_or_html, AttentionView):
            view_or_html.save(path)
        else:
            path.write_text(view_or_html, encoding="utf-8")
        page = OfflinePage(browser, path)
        opened.append(page)
        return page

    yield _open
    for page in opened:
        page.context.close()


def test_page_loads_offline_and_requests_nothing_but_itself(open_page: Callable) -> None:
    viewer = open_page(AttentionView(weights_for_test(), TOKENS))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert viewer.requests == [viewer.url]
    assert viewer.errors == []  # also catches Content-Security-Policy violations
    assert page.locator("#layer-select option").count() == 2
    assert page.locator("#head-select option").count() == 3
    assert page.locator(".token.query").all_text_contents() == TOKENS
    assert page.locator(".token.key").all_text_contents() == TOKENS
    assert page.locator("canvas.thumb").count() == 2 * 3
    box = page.locator("canvas#heatmap").bounding_box()
    assert box is not None and box["width"] == box["height"] > 8 * 20  # big cells at T = 8


def test_changing_head_and_layer_changes_the_view(open_page: Callable) -> None:
    weights = weights_for_test()
    report = diagnose(weights, TOKENS)
    viewer = open_page(AttentionView(weights, TOKENS))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    np.testing.assert_allclose(viewer.cell_values(), weights[0, 0], atol=EXACT_ATOL)

    page.select_option("#head-select", "1")
    np.testing.assert_allclose(viewer.cell_values(), weights[0, 1], atol=EXACT_ATOL)
    assert page.get_attribute("#attnlab-view", "data-head") == "1"
    entropy = page.text_content("#head-metrics tr[data-metric='entropy'] td")
    assert entropy == f"{report.head(0, 1).entropy:.3f}"

    page.select_option("#layer-select", "1")
    np.testing.assert_allclose(viewer.cell_values(), weights[1, 1], atol=EXACT_ATOL)
    entropy = page.text_content("#head-metrics tr[data-metric='entropy'] td")
    assert entropy == f"{report.head(1, 1).entropy:.3f}"
    assert viewer.errors == []


def test_hovering_a_token_highlights_its_row_and_draws_its_lines(open_page: Callable) -> None:
    weights = weights_for_test()
    viewer = open_page(AttentionView(weights, TOKENS))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert viewer.highlighted_rows() == []

    page.hover(".token.query[data-index='2']")
    assert viewer.highlighted_rows() == [2]
    assert "active" in (page.get_attribute(".token.query[data-index='2']", "class") or "")
    lines = page.eval_on_selector_all(
        "#lines line.focus",
        "ls => ls.map(l => [+l.dataset.q, +l.dataset.k, +l.getAttribute('stroke-opacity')])")
    assert [(q, k) for q, k, _ in lines] == [(2, k) for k in range(len(TOKENS))]
    # stroke-opacity is written with 4 decimals (5e-5) on top of the codes' 1e-5
    np.testing.assert_allclose([w for _, _, w in lines], weights[0, 0, 2], atol=6e-5)

    page.hover("#heatmap-queries .axis-label >> nth=5")  # the row label works too
    assert viewer.highlighted_rows() == [5]

    page.locator("canvas#heatmap").scroll_into_view_if_needed()
    box = page.locator("canvas#heatmap").bounding_box()
    assert box is not None
    cell = box["width"] / len(TOKENS)
    page.mouse.move(box["x"] + 6.5 * cell, box["y"] + 4.5 * cell)  # the cell (4, 6)
    assert viewer.highlighted_rows() == [4]
    tip = page.text_content("#cell-tip") or ""
    assert tip.startswith(f"{TOKENS[4]} \u2192 {TOKENS[6]}: ")
    assert float(tip.rsplit(" ", 1)[1]) == pytest.approx(weights[0, 0, 4, 6], abs=1e-4)

    page.hover(".token.key[data-index='3']")  # a key highlights its column, not a row
    assert viewer.highlighted_rows() == []
    assert viewer.highlighted_columns() == [3]

    page.mouse.move(1390, 890)  # off the view: back to the resting state
    assert viewer.highlighted_rows() == []
    assert viewer.highlighted_columns() == []


def test_injected_markup_in_tokens_is_shown_as_text_and_never_runs(open_page: Callable) -> None:
    tokens = TOKENS.copy()
    tokens[3], tokens[4] = INJECTED, SCRIPT_BREAK
    title = '<img src=y onerror="window.__pwned = 3">'
    viewer = open_page(AttentionView(weights_for_test(), tokens, title=title))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    page.hover(".token.query[data-index='3']")  # rendering on hover must be safe as well
    page.hover(".token.key[data-index='4']")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    # No element was created from the text: a regression to innerHTML would add <img>.
    assert page.locator("img").count() == 0
    assert page.locator(".token.query").nth(3).text_content() == INJECTED
    assert page.locator(".token.key").nth(4).text_content() == SCRIPT_BREAK
    assert page.get_by_text(INJECTED, exact=True).first.is_visible()
    assert page.text_content("#view-title") == title
    assert viewer.requests == [viewer.url]  # src=x was never fetched
    assert viewer.errors == []


def test_two_views_on_one_notebook_page_stay_independent(open_page: Callable) -> None:
    weights = weights_for_test()
    first, second = AttentionView(weights, TOKENS), AttentionView(weights[::-1], TOKENS)
    notebook = ("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                f"{first._repr_html_()}{second._repr_html_()}</body></html>")
    viewer = open_page(notebook)
    page = viewer.page
    frames = [page.frame_locator("iframe.attnlab-view").nth(i) for i in range(2)]
    for frame in frames:
        frame.locator("#attnlab-view[data-ready='1']").wait_for()
    frames[0].locator(".token.query[data-index='1']").hover()
    rows = [frame.locator("#heatmap-overlay .row-highlight").evaluate_all(
        "rows => rows.map(r => +r.dataset.row)") for frame in frames]
    assert rows == [[1], []]
    values = frames[1].locator("#attnlab-view").evaluate("root => root.attnlab.shown()")
    np.testing.assert_allclose(np.reshape(values, (8, 8)), weights[1, 0], atol=EXACT_ATOL)
    assert viewer.errors == []


def test_several_tokens_stay_selected_and_thumbnails_choose_the_head(open_page: Callable) -> None:
    weights = weights_for_test()
    viewer = open_page(AttentionView(weights, TOKENS, layers=[2, 5], heads=[0, 3, 7]))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    # The model's own numbers, counted from 1, label the selection (layers 3 and 6).
    assert page.locator("#layer-select option").all_text_contents() == ["Layer 3", "Layer 6"]
    assert page.locator("#head-select option").all_text_contents() == [
        "Head 1", "Head 4", "Head 8"]

    page.click(".token.query[data-index='1']")
    page.click(".token.query[data-index='4']")
    page.mouse.move(1390, 890)
    assert viewer.highlighted_rows() == [1, 4]
    lines = page.eval_on_selector_all("#lines line.focus", "ls => ls.map(l => +l.dataset.q)")
    assert sorted(set(lines)) == [1, 4] and len(lines) == 2 * len(TOKENS)
    page.click(".token.query[data-index='1']")  # a second click deselects
    page.mouse.move(1390, 890)
    assert viewer.highlighted_rows() == [4]

    page.wait_for_selector("#attnlab-view[data-overview-ready='1']")
    page.click("canvas.thumb[data-layer='1'][data-head='2']")
    assert page.get_attribute("#attnlab-view", "data-layer") == "1"
    assert page.get_attribute("#attnlab-view", "data-head") == "2"
    np.testing.assert_allclose(viewer.cell_values(), weights[1, 2], atol=EXACT_ATOL)
    page.uncheck("#layer-filter input[data-index='0']")
    assert page.locator(".overview-row[data-layer='0']").is_hidden()
    assert page.locator(".overview-row[data-layer='1']").is_visible()
    assert viewer.errors == []


def test_rollout_and_importance_panels(open_page: Callable) -> None:
    weights = weights_for_test()
    rollout = weights[0].mean(axis=0)  # (T, T), rows sum to 1
    importance = np.arange(6, dtype=float).reshape(2, 3) / 10
    viewer = open_page(AttentionView(weights, TOKENS, rollout=rollout, importance=importance))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert page.locator("#rollout-panel").is_visible()
    cells = page.eval_on_selector_all("#importance-table td", "tds => tds.map(t => t.textContent)")
    assert cells == [f"{v:.3f}" for v in importance.ravel()]
    page.click("#importance-table td[data-layer='1'][data-head='0']")
    np.testing.assert_allclose(viewer.cell_values(), weights[1, 0], atol=EXACT_ATOL)
    assert viewer.errors == []


def test_a_512_token_page_of_minilm_stays_small_and_usable(open_page: Callable,
                                                           tmp_path: Path) -> None:
    """Real weights (all-MiniLM-L6-v2, 6 layers × 12 heads, T = 512): the page stays under
    12 MB, opens, and hovering still highlights the right row. (How fast it opens is
    measured by benchmarks/bench_viewer.py, not asserted here.)"""
    from attnlab.models.loading import load_bert, minilm_path

    model = load_bert(minilm_path(), max_length=512)
    text = " ".join(LONG_TEXT for _ in range(30))
    trace = model.run(text, keep=("weights",))
    weights = trace.attention()  # (6, 12, 512, 512)
    assert weights.shape == (6, 12, 512, 512)
    view = AttentionView(weights, trace.tokens)
    assert len(view.html.encode("utf-8")) <= 12_000_000
    viewer = open_page(view)
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']", timeout=30_000)
    page.select_option("#layer-select", "4")
    page.select_option("#head-select", "7")
    shown = viewer.cell_values(512)
    # 8-bit codes per row max: within row max / 510 < 0.002 of the model's weights.
    np.testing.assert_allclose(shown, weights[4, 7], atol=0.002)
    page.hover(".token.query[data-index='300']")
    assert viewer.highlighted_rows() == [300]
    page.locator("canvas#heatmap").scroll_into_view_if_needed()
    box = page.locator("canvas#heatmap").bounding_box()
    assert box is not None and box["width"] == 512  # one pixel per weight
    page.mouse.move(box["x"] + 10.5, box["y"] + 200.5)
    assert viewer.highlighted_rows() == [200]
    page.wait_for_selector("#attnlab-view[data-overview-ready='1']", timeout=30_000)
    assert viewer.errors == []


LONG_TEXT = ("The animal didn't cross the street because it was too tired. Rivers carry "
             "water from the hills to the sea, and the bank of a river is not a bank that "
             "keeps money.")
