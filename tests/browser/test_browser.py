"""The viewer page in a real browser: Debian's headless Chromium, driven by Playwright.

Playwright's own browser download needs the network, so the tests use the system
Chromium at /usr/bin/chromium (``scripts/install-system-deps.sh`` installs it). A missing
browser or Playwright is a set-up error: the tests fail and say how to fix it, they do
not skip.

Every page is opened from disk with the network off: the context is offline and every
request other than the page file itself is aborted and recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnlab.lens.diagnostics import diagnose
from attnlab.report.viewer import AttentionView

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


# ------------------------------------------------------------ decoders, pairs, neuron view

CAUSAL_T, PROMPT = 8, 5


def decoder_data(seed: int = 3) -> dict[str, np.ndarray]:
    """A causal head set computed here, independently of the page: scores = q·k·scale,
    −inf above the diagonal, softmax; 4 query heads sharing 2 key/value heads."""
    rng = np.random.default_rng(seed)
    L, H, Hkv, T, D = 2, 4, 2, CAUSAL_T, 6
    q, k = rng.normal(size=(L, H, T, D)), rng.normal(size=(L, Hkv, T, D))
    scales = np.array([D ** -0.5, 0.7])
    scores = np.einsum("lhtd,lhsd->lhts", q, np.repeat(k, H // Hkv, axis=1))
    scores = scores * scales[:, None, None, None]
    allowed = np.tril(np.ones((T, T), dtype=bool))
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    return {"weights": weights, "q": q, "k": k, "scales": scales, "allowed": allowed,
            "norms": rng.uniform(0.2, 3.0, size=(L, H, T)), "scores": scores}


def decoder_view(tokens: list[str] | None = None, **extra: Any) -> AttentionView:
    d = decoder_data()
    options: dict[str, Any] = {
        "allowed": d["allowed"], "prompt_length": PROMPT, "heads_per_kv": 2,
        "queries": d["q"], "keys": d["k"], "scales": d["scales"], "value_norms": d["norms"]}
    options.update(extra)
    return AttentionView(d["weights"], tokens or TOKENS, **options)


def canvas_pixel(page: Any, x: float, y: float) -> list[int]:
    return page.eval_on_selector(
        "canvas#heatmap", f"c => Array.from(c.getContext('2d').getImageData({x}, {y}, 1, 1).data)")


def test_not_allowed_cells_are_hatched_and_say_so_never_zero(open_page: Callable) -> None:
    viewer = open_page(decoder_view())
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    page.locator("canvas#heatmap").scroll_into_view_if_needed()
    box = page.locator("canvas#heatmap").bounding_box()
    assert box is not None
    cell = box["width"] / CAUSAL_T
    # Every pixel of the masked cell (1, 6) is hatch (white or grey lines), none is the
    # palette's colour of weight 0 (255, 255, 217) nor any number drawn on it.
    colours = {tuple(canvas_pixel(page, 6 * cell + dx, 1 * cell + dy)[:3])
               for dx in range(0, int(cell), 3) for dy in range(0, int(cell), 3)}
    assert (255, 255, 217) not in colours
    assert all(max(c) - min(c) < 25 for c in colours)  # white and the grey hatch lines
    assert len(colours) >= 2  # lines and background: a hatch, not a flat fill
    page.mouse.move(box["x"] + 6.5 * cell, box["y"] + 1.5 * cell)
    assert (page.text_content("#cell-tip") or "").endswith("not allowed (masked: this query "
                                                          "may not see this key)")
    page.hover(".token.query[data-index='2']")  # lines only to the keys it may see
    keys = page.eval_on_selector_all("#lines line.focus", "ls => ls.map(l => +l.dataset.k)")
    assert keys == [0, 1, 2]
    assert page.locator("#mask-legend").is_visible()
    assert viewer.errors == []


def test_prompt_and_generated_tokens_and_the_step_slider(open_page: Callable) -> None:
    viewer = open_page(decoder_view())
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    generated = page.eval_on_selector_all(".token.query.generated",
                                          "ts => ts.map(t => +t.dataset.index)")
    assert generated == list(range(PROMPT, CAUSAL_T))
    assert page.get_attribute("#attnlab-view", "data-step") == str(CAUSAL_T - PROMPT)
    page.fill("#step-slider", "1")  # the prefill and one generated token
    page.dispatch_event("#step-slider", "input")
    assert page.get_attribute("#attnlab-view", "data-step") == "1"
    assert page.text_content("#step-label") == "step 1 of 3: the KV cache holds 6 keys"
    visible = page.eval_on_selector_all(
        ".token.key", "ts => ts.filter(t => getComputedStyle(t).visibility !== 'hidden')"
        ".map(t => +t.dataset.index)")
    assert visible == list(range(PROMPT + 1))
    page.hover(".token.key[data-index='0']")  # a key's lines stop at the step's last row
    rows = page.eval_on_selector_all("#lines line.focus", "ls => ls.map(l => +l.dataset.q)")
    assert rows == list(range(PROMPT + 1))
    assert viewer.errors == []


def test_heads_sharing_a_kv_head_are_grouped(open_page: Callable) -> None:
    viewer = open_page(decoder_view())
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    groups = page.eval_on_selector_all(
        "#head-select optgroup",
        "gs => gs.map(g => [g.label, Array.from(g.children).map(o => o.textContent)])")
    assert groups == [["KV head 1", ["Head 1", "Head 2"]], ["KV head 2", ["Head 3", "Head 4"]]]
    page.wait_for_selector("#attnlab-view[data-overview-ready='1']")
    starts = page.eval_on_selector_all("canvas.thumb.group-start[data-layer='0']",
                                       "ts => ts.map(t => +t.dataset.head)")
    assert starts == [2]
    assert viewer.errors == []


def test_head_view_overlays_several_heads_in_their_colours(open_page: Callable) -> None:
    d = decoder_data()
    viewer = open_page(decoder_view())
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    page.check("#overlay-heads input[data-head='2']")
    page.hover(".token.query[data-index='6']")
    lines = page.eval_on_selector_all(
        "#lines line.focus", "ls => ls.map(l => [+l.dataset.head, +l.dataset.k, "
        "+l.getAttribute('stroke-opacity'), l.getAttribute('stroke')])")
    assert sorted({h for h, *_ in lines}) == [0, 2]
    for head in (0, 2):
        mine = [(k, w) for h, k, w, _ in lines if h == head]
        assert [k for k, _ in mine] == list(range(7))
        # stroke-opacity has 4 decimals on top of the 16-bit codes
        np.testing.assert_allclose([w for _, w in mine], d["weights"][0, head, 6, :7], atol=6e-5)
    assert len({colour for h, _, _, colour in lines if h == 0} |
               {colour for h, _, _, colour in lines if h == 2}) == 2
    assert viewer.errors == []


def test_neuron_view_q_dot_k_gives_the_patterns_logits(open_page: Callable) -> None:
    d = decoder_data()
    viewer = open_page(decoder_view(start=(1, 3)))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert page.get_attribute("#attnlab-view", "data-layer") == "1"  # opens on `start`
    assert page.get_attribute("#attnlab-view", "data-head") == "3"
    assert page.locator("#neuron-view").is_visible()
    one = page.eval_on_selector("#attnlab-view", "r => r.attnlab.neuron(1, 3, 6, 2)")
    q, k = d["q"][1, 3, 6], d["k"][1, 1, 2]  # head 3 reads key/value head 3 // 2 = 1
    np.testing.assert_allclose(one["q"], q, rtol=1e-6)  # float32 on the page
    np.testing.assert_allclose(one["products"], q * k, rtol=1e-5, atol=1e-6)
    assert one["logit"] == pytest.approx(d["scores"][1, 3, 6, 2], rel=1e-5, abs=1e-6)
    # The whole row: softmax of the page's logits is the pattern the page shows.
    logits = page.eval_on_selector("#attnlab-view", "r => r.attnlab.rowLogits(1, 3, 6)")
    assert logits[7] is None  # not allowed: no score at all
    row = np.exp(np.array(logits[:7]) - max(logits[:7]))
    np.testing.assert_allclose(row / row.sum(), d["weights"][1, 3, 6, :7], atol=1e-5)
    page.locator("canvas#heatmap").scroll_into_view_if_needed()
    box = page.locator("canvas#heatmap").bounding_box()
    assert box is not None
    cell = box["width"] / CAUSAL_T
    page.mouse.click(box["x"] + 1.5 * cell, box["y"] + 4.5 * cell)  # the pair (4, 1)
    assert page.get_attribute("#attnlab-view", "data-neuron") == "4,1"
    assert "logit" in (page.text_content("#neuron-sum") or "")
    assert viewer.errors == []


def test_norms_view_shows_weight_times_value_norm(open_page: Callable) -> None:
    d = decoder_data()
    viewer = open_page(decoder_view())
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert "Jain & Wallace 2019" in (page.text_content("#norms-note") or "")
    page.select_option("#measure-select", "norms")
    assert page.get_attribute("#attnlab-view", "data-measure") == "norms"
    expected = d["weights"][0, 0] * d["norms"][0, 0][None, :]  # α_ij · ‖v_j W_O‖
    np.testing.assert_allclose(viewer.cell_values(CAUSAL_T), expected, rtol=1e-4, atol=1e-5)
    page.select_option("#measure-select", "weights")
    np.testing.assert_allclose(viewer.cell_values(CAUSAL_T), d["weights"][0, 0], atol=EXACT_ATOL)
    assert viewer.errors == []


def test_sentence_filters_keep_only_the_chosen_pair_of_sentences(open_page: Callable) -> None:
    viewer = open_page(AttentionView(weights_for_test(), TOKENS, segments=[0] * 4 + [1] * 4))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    page.select_option("#segment-select", "AB")
    page.hover(".token.query[data-index='1']")
    keys = page.eval_on_selector_all("#lines line.focus", "ls => ls.map(l => +l.dataset.k)")
    assert keys == [4, 5, 6, 7]
    dim = page.eval_on_selector_all(".token.key.dim", "ts => ts.map(t => +t.dataset.index)")
    assert dim == [0, 1, 2, 3]
    page.select_option("#segment-select", "all")
    page.hover(".token.query[data-index='2']")
    assert len(page.locator("#lines line.focus").all()) == len(TOKENS)
    assert viewer.errors == []


def test_sink_columns_are_marked_and_explained(open_page: Callable) -> None:
    d = decoder_data()
    weights = d["weights"].copy()
    weights[:, :, :, 0] += 4.0 * d["allowed"][:, 0]  # every row leans on the first token
    weights /= weights.sum(axis=-1, keepdims=True)
    viewer = open_page(AttentionView(weights, TOKENS, allowed=d["allowed"]))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert page.get_attribute("#attnlab-view", "data-sinks") == "0"
    assert page.locator("#heatmap-sinks .sink-mark[data-col='0']").count() == 1
    note = page.text_content("#sink-note") or ""
    assert "sum to 1" in note and page.locator("#sink-box").is_visible()
    plain = open_page(AttentionView(d["weights"], TOKENS, allowed=d["allowed"]))
    plain.page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert plain.page.get_attribute("#attnlab-view", "data-sinks") == ""
    assert viewer.errors == [] and plain.errors == []


def test_png_export_downloads_the_shown_view(open_page: Callable, tmp_path: Path) -> None:
    viewer = open_page(decoder_view())
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    # Drawing the view into a PNG and handing it over can take seconds on a busy machine:
    # a generous wait, not a speed check.
    with page.expect_download(timeout=30_000) as download_info:
        page.click("#export-png")
    download = download_info.value
    assert download.suggested_filename == "attention-layer1-head1.png"
    saved = tmp_path / "view.png"
    download.save_as(saved)
    png = saved.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    canvas = page.locator("canvas#heatmap").bounding_box()
    assert canvas is not None and width >= canvas["width"] and height >= canvas["height"]
    assert viewer.requests == [viewer.url]
    assert viewer.errors == []


def test_rollout_has_token_labels_and_a_colour_scale(open_page: Callable) -> None:
    weights = weights_for_test()
    viewer = open_page(AttentionView(weights, TOKENS, rollout=weights[0].mean(axis=0)))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    labels = page.locator("#rollout-queries .axis-label").all_text_contents()
    assert labels == TOKENS  # 8 tokens: every one fits
    assert page.locator("#rollout-keys .axis-label").all_text_contents() == TOKENS
    assert page.text_content("#rollout-scale-low") == "0"
    assert (page.text_content("#rollout-scale-high") or "").startswith("max ")
    assert viewer.errors == []


def test_in_a_notebook_the_frame_fits_its_content(open_page: Callable) -> None:
    view = decoder_view()
    notebook = ("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
                f"{view._repr_html_()}</body></html>")
    viewer = open_page(notebook)
    page = viewer.page
    frame = page.frame_locator("iframe.attnlab-view")
    frame.locator("#attnlab-view[data-ready='1']").wait_for()
    guess = 190 + CAUSAL_T * 22  # what _repr_html_ starts with, before the page says more
    page.wait_for_function(f"document.querySelector('iframe').getBoundingClientRect().height "
                           f"!== Math.max(420, {guess})")
    outer = page.eval_on_selector("iframe", "f => f.getBoundingClientRect().height")
    inner = frame.locator("#attnlab-view").evaluate("r => r.getBoundingClientRect().height")
    assert abs(outer - (inner + 4)) <= 2  # the whole view shows, no inner scrollbar
    assert viewer.errors == []


# ------------------------------------------------------------ attnlab inspect --model

HOSTILE_TOKENS = ["</script><img src=x onerror=\"window.__pwned = 4\">", "$x$"]


def test_inspect_model_page_of_a_decoder_in_the_browser(open_page: Callable,
                                                        tmp_path: Path) -> None:
    """A random Llama whose vocabulary holds hostile tokens whole: the page of
    ``inspect --model --generate`` opens offline, shows them as text, slides over the
    generation, overlays heads, and its neuron view's scores give eager's weights."""
    import json
    import re

    import torch
    import transformers
    from tests.support.hf_folders import llama_folder

    from attnlab.cli.app import main

    folder = llama_folder(tmp_path / "llama", extra_tokens=HOSTILE_TOKENS)
    text = f"the cat {HOSTILE_TOKENS[0]} sat {HOSTILE_TOKENS[1]} on the mat"
    assert main(["inspect", "--model", str(folder), text, "--generate", "3",
                 "--out", str(tmp_path / "out")]) == 0
    html = (tmp_path / "out" / "view.html").read_text(encoding="utf-8")
    payload = json.loads(re.search(r'id="attnlab-data">(.*?)</script>', html, re.S).group(1))
    tokens, P = payload["tokens"], payload["prompt_length"]
    assert HOSTILE_TOKENS[0] in tokens and HOSTILE_TOKENS[1] in tokens  # whole tokens
    T = len(tokens)
    viewer = open_page(html)
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("img").count() == 0
    assert HOSTILE_TOKENS[0] in page.locator(".token.query").all_text_contents()
    assert viewer.requests == [viewer.url]

    page.fill("#step-slider", "0")  # the prompt alone: no generated key yet
    page.dispatch_event("#step-slider", "input")
    page.hover(".token.key[data-index='0']")
    rows = page.eval_on_selector_all("#lines line.focus", "ls => ls.map(l => +l.dataset.q)")
    assert rows == list(range(P))

    page.fill("#step-slider", "3")
    page.dispatch_event("#step-slider", "input")
    current = int(page.get_attribute("#attnlab-view", "data-head") or "0")
    other = (current + 1) % 4
    page.check(f"#overlay-heads input[data-head='{other}']")
    page.hover(f".token.query[data-index='{T - 1}']")
    heads = page.eval_on_selector_all("#lines line.focus", "ls => ls.map(l => +l.dataset.head)")
    assert sorted(set(heads)) == sorted({current, other}) and len(heads) == 2 * T

    eager = transformers.AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager").eval()
    ids = torch.tensor([transformers.AutoTokenizer.from_pretrained(folder)
                        .convert_tokens_to_ids(tokens)])
    with torch.no_grad():
        reference = eager(input_ids=ids, output_attentions=True).attentions
    for layer, head, query in ((0, 0, T - 1), (1, 3, P - 1)):
        logits = page.eval_on_selector(
            "#attnlab-view", f"r => r.attnlab.rowLogits({layer}, {head}, {query})")
        assert all(v is None for v in logits[query + 1:])  # causal: no later key
        row = np.array(logits[: query + 1])
        expected = reference[layer][0, head, query, : query + 1].double().numpy()
        # q·k·scale from the page's float32 q and k, softmaxed here: eager's weights
        # (float32 model: 1e-6).
        np.testing.assert_allclose(np.exp(row - row.max()) / np.exp(row - row.max()).sum(),
                                   expected, atol=1e-6)
        # and the scores themselves: differences of logits are differences of log-weights
        np.testing.assert_allclose(row - row[0], np.log(expected) - np.log(expected[0]),
                                   atol=1e-4)
    assert viewer.errors == []


def test_a_previous_token_head_is_not_badged_over_sparse(open_page: Callable) -> None:
    """The badges word the flags as the text table does: a previous-token head's one-hot
    rows are expected ("one-hot by position"), a one-hot head on the first token is
    over-sparse."""
    from attnlab.report.words import FLAG_TEXT

    T = len(TOKENS)
    weights = np.zeros((1, 2, T, T))  # (L, H, T, T)
    for t in range(T):
        weights[0, 0, t, max(t - 1, 0)] = 1.0  # previous token
    weights[0, 1, :, 0] = 1.0  # always the first token
    viewer = open_page(AttentionView(weights, TOKENS))
    page = viewer.page
    page.wait_for_selector("#attnlab-view[data-ready='1']")

    def badges() -> dict[str, str]:
        return dict(page.eval_on_selector_all(
            "#head-flags .flag", "spans => spans.map(s => [s.dataset.flag, s.textContent])"))

    shown = badges()
    assert "over_sparse" not in shown and "previous_token" in shown
    assert shown["over_sparse_positional"] == FLAG_TEXT["over_sparse_positional"]["en"]
    page.select_option("#head-select", "1")
    assert badges()["over_sparse"] == FLAG_TEXT["over_sparse"]["en"]
    assert viewer.errors == []
