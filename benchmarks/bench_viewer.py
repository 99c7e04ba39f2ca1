"""How big the viewer page is and how fast it opens, at the model's full 512 positions.

Runs all-MiniLM-L6-v2 (6 layers × 12 heads) on a text of T tokens, writes the viewer
page, opens it in headless Chromium (Debian's, at /usr/bin/chromium, offline), and
prints: the page size; the time from navigation to the first drawn head (the page's
``data-ready``); to every thumbnail of the overview drawn (``data-overview-ready``);
and how long a hover takes to highlight a row. Each timing is the median of
--repeats fresh page loads. Targets at T = 512: page <= 12 MB, opens and draws in <= 3 s.

    .venv/bin/python benchmarks/bench_viewer.py --tokens 512 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT = ("The animal didn't cross the street because it was too tired. Rivers carry water "
        "from the hills to the sea, and the bank of a river is not a bank that keeps money. ")
CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512, help="T (default 512)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    from attnlab.models.loading import load_bert, minilm_path
    from attnlab.report.viewer import AttentionView

    model = load_bert(minilm_path(), max_length=args.tokens)
    trace = model.run(TEXT * (args.tokens // 20 + 1), keep=("weights",))
    weights = trace.attention()  # (6, 12, T, T)
    started = time.perf_counter()
    view = AttentionView(weights, trace.tokens)
    build = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as folder:
        path = view.save(Path(folder) / "view.html")
        size = path.stat().st_size
        ready, overview, hover = [], [], []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
            for _ in range(args.repeats):
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                context.set_offline(True)
                page = context.new_page()
                page.goto(path.resolve().as_uri())
                page.wait_for_selector("#attnlab-view[data-ready='1']", timeout=60_000)
                ready.append(page.evaluate("performance.now()") / 1000)
                page.wait_for_selector("#attnlab-view[data-overview-ready='1']", timeout=60_000)
                overview.append(page.evaluate("performance.now()") / 1000)
                t0 = time.perf_counter()
                page.hover(".token.query[data-index='300']")
                page.wait_for_selector("#heatmap-overlay .row-highlight[data-row='300']")
                hover.append(time.perf_counter() - t0)
                context.close()
            browser.close()
    L, H, T, S = weights.shape
    print(f"viewer page for (L, H, T, S) = ({L}, {H}, {T}, {S}): {size / 1e6:.2f} MB "
          f"(built in {build:.2f} s)")
    print(f"open -> first head drawn: {statistics.median(ready):.2f} s (median of "
          f"{args.repeats}; runs {', '.join(f'{t:.2f}' for t in ready)})")
    print(f"open -> all {L * H} thumbnails drawn: {statistics.median(overview):.2f} s")
    print(f"hover -> row highlighted: {statistics.median(hover) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
