"""The training page (attnlab train's view.html) in headless Chromium: it draws, the slider
moves through the steps, hostile labels stay text, nothing is fetched."""

from __future__ import annotations

import numpy as np

from attnlab.report.training import training_html

INJECTED = '<img src=x onerror="window.__pwned = 1">'
SCRIPT_BREAK = "</script><script>window.__pwned = 2</script>"


def test_training_page_draws_and_slides(tmp_path, browser):
    K, L, H, T = 3, 2, 2, 5
    rng = np.random.default_rng(0)
    snapshots = rng.dirichlet(np.ones(T), size=(K, L, H, T))  # (K, L, H, T, T)
    tokens = [INJECTED, SCRIPT_BREAK, "a", "b", "c"]
    history = {"induction": rng.random((K, L, H)), "previous_token": rng.random((K, L, H))}
    path = tmp_path / "view.html"
    path.write_text(training_html(snapshots, [0, 10, 20], tokens, head_history=history,
                                  heldout_loss=[3.0, 2.0, 1.0], period=2), encoding="utf-8")
    requests: list[str] = []
    errors: list[str] = []
    context = browser.new_context()
    context.set_offline(True)
    page = context.new_page()
    page.on("request", lambda request: requests.append(request.url))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(path.resolve().as_uri())
    _check(page)
    context.close()
    assert not errors and all(url.startswith("file:") for url in requests)


def _check(page):
    T = 5
    assert page.locator("#heatmap td").count() == T * T
    assert "20 / 20" in page.inner_text("#step-value")
    page.fill("#step-slider", "1")
    page.dispatch_event("#step-slider", "input")
    assert "10 / 20" in page.inner_text("#step-value")
    assert "2.0000" in page.inner_text("#loss-line")
    # query 3 (0-based) of period 2 looks at key 2: the dashed stripe cell
    assert page.locator("#heatmap td.stripe").count() == T - 3
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#heatmap thead th").nth(1).inner_text() == INJECTED
