"""How big the viewer page is and how fast it opens, at the model's full 512 positions.

Runs all-MiniLM-L6-v2 (6 layers × 12 heads) on a text of T tokens, writes the viewer
page, opens it in headless Chromium (Debian's, at /usr/bin/chromium, offline), and
prints: the page size; the time from navigation to the first drawn head (the page's
``data-ready``); to every thumbnail of the overview drawn (``data-overview-ready``);
and how long a hover takes to highlight a row. Each timing is the median of
--repeats fresh page loads. Targets at T = 512: page <= 12 MB, opens and draws in <= 3 s.

With --decoder, the page of a decoder instead: a random Llama saved as a Hugging Face
folder (4 layers × 8 query heads sharing 2 key/value heads, width 256, MiniLM's
tokenizer), read by attnlab.lens.hf_runs at T tokens (default 1,024) and drawn with
everything inspect --model gives it: the causal mask (hatched), the neuron view's q and
k, the value norms and the rollout.

    .venv/bin/python benchmarks/bench_viewer.py --tokens 512 --repeats 3
    .venv/bin/python benchmarks/bench_viewer.py --decoder --tokens 1024 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT = ("The animal didn't cross the street because it was too tired. Rivers carry water "
        "from the hills to the sea, and the bank of a river is not a bank that keeps money. ")
CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=512, help="T (default 512)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--decoder", action="store_true",
                        help="a random Llama (grouped heads) at T tokens instead of MiniLM")
    args = parser.parse_args()
    if args.decoder:
        with tempfile.TemporaryDirectory() as folder:
            view, shape, build = decoder_view(Path(folder), args.tokens)
            measure(view, shape, args.repeats, build)
        return

    from attnlab.models.loading import load_bert, minilm_path
    from attnlab.report.viewer import AttentionView

    model = load_bert(minilm_path(), max_length=args.tokens)
    trace = model.run(TEXT * (args.tokens // 20 + 1), keep=("weights",))
    weights = trace.attention()  # (6, 12, T, T)
    started = time.perf_counter()
    view = AttentionView(weights, trace.tokens)
    build = time.perf_counter() - started
    measure(view, weights.shape, args.repeats, build)


def decoder_view(folder: Path, tokens: int) -> tuple[Any, tuple[int, ...], float]:
    """The page inspect --model draws for a random Llama at ``tokens`` tokens."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from attnlab.hf import register
    from attnlab.lens.hf_runs import load_hf, run_hf
    from attnlab.lens.rollout import attention_rollout
    from attnlab.models.loading import minilm_path
    from attnlab.report.viewer import AttentionView

    logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=256,
                         intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, max_position_embeddings=4096,
                         pad_token_id=0, bos_token_id=None, eos_token_id=None)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    register()  # load_hf reads the hook points of attnlab's registered attention
    hf = load_hf(str(folder), max_length=tokens)
    run = run_hf(hf, TEXT * (tokens // 20 + 1))
    T = run.weights.shape[-1]
    started = time.perf_counter()
    view = AttentionView(run.weights, run.tokens, allowed=np.tril(np.ones((T, T), dtype=bool)),
                         heads_per_kv=4, queries=run.q, keys=run.k, scales=run.scales,
                         value_norms=run.value_norms, rollout=attention_rollout(run.weights),
                         title="random Llama")
    return view, run.weights.shape, time.perf_counter() - started


def measure(view: Any, shape: tuple[int, ...], repeats: int, build: float) -> None:
    """Page size, then time to the first head drawn, to every thumbnail and to a hover."""
    from playwright.sync_api import sync_playwright

    args = argparse.Namespace(repeats=repeats)
    L, H, T, S = shape
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
                row = min(300, T - 1)
                page.hover(f".token.query[data-index='{row}']")
                page.wait_for_selector(f"#heatmap-overlay .row-highlight[data-row='{row}']")
                hover.append(time.perf_counter() - t0)
                context.close()
            browser.close()
    print(f"viewer page for (L, H, T, S) = ({L}, {H}, {T}, {S}): {size / 1e6:.2f} MB "
          f"(built in {build:.2f} s)")
    print(f"open -> first head drawn: {statistics.median(ready):.2f} s (median of "
          f"{args.repeats}; runs {', '.join(f'{t:.2f}' for t in ready)})")
    print(f"open -> all {L * H} thumbnails drawn: {statistics.median(overview):.2f} s")
    print(f"hover -> row highlighted: {statistics.median(hover) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
