"""Regenerate the documentation's pictures (docs/*.png: the README and the site) from the
real model (all-MiniLM-L6-v2).

    .venv/bin/python scripts/make_docs_images.py

Writes docs/heatmap-grid.png (every layer × head for one sentence), docs/explain.png
(seed 000's example, 2 heads, Chinese labels), docs/draw-flash.png (flash attention's
tiles, step by step), docs/viewer.png (a screenshot of
the interactive viewer in headless Chromium, a token hovered) and docs/decoder-view.png
(``attnlab inspect --model`` on a small random Llama folder with grouped heads, 8
generated tokens, at the last generation step, the neuron view open).

    .venv/bin/python scripts/make_docs_images.py --decoder-only   # just the last one
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TEXT = "The animal didn't cross the street because it was too tired."
CHROMIUM = os.environ.get("ATTNLAB_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def main() -> None:
    attnlab = [sys.executable, "-m", "attnlab"]
    decoder_picture(attnlab)
    if "--decoder-only" in sys.argv[1:]:
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([*attnlab, "inspect", TEXT, "--out", tmp], check=True,
                       stdout=subprocess.DEVNULL)
        (DOCS / "heatmap-grid.png").write_bytes((Path(tmp) / "grid.png").read_bytes())
        explain_dir = Path(tmp) / "explain"
        subprocess.run([*attnlab, "explain", "--tokens", "小明 去了 学校", "--heads", "2",
                        "--lang", "zh", "--out", str(explain_dir)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        (DOCS / "explain.png").write_bytes((explain_dir / "heatmap.png").read_bytes())
        subprocess.run([*attnlab, "draw", "flash", "--lang", "zh", "--out", tmp], check=True,
                       stdout=subprocess.DEVNULL)
        (DOCS / "draw-flash.png").write_bytes((Path(tmp) / "flash.png").read_bytes())
        shoot(Path(tmp) / "view.html", DOCS / "viewer.png")


def decoder_picture(attnlab: list[str]) -> None:
    """docs/decoder-view.png: the page of a decoder. The Llama is random, with weights
    drawn wider than usual (initializer_range 0.4) so that its heads do not all attend
    uniformly; its tokenizer is MiniLM's."""
    import torch
    from playwright.sync_api import sync_playwright
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from attnlab.models.loading import minilm_path

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny-llama"
        tokenizer = AutoTokenizer.from_pretrained(str(minilm_path()))
        torch.manual_seed(1)
        config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64,
                             intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, initializer_range=0.4,
                             pad_token_id=0, bos_token_id=None, eos_token_id=None)
        LlamaForCausalLM(config).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        subprocess.run([*attnlab, "inspect", "--model", str(folder), "The cat sat on the mat.",
                        "--generate", "8", "--out", tmp], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            page.goto((Path(tmp) / "view.html").as_uri())
            page.wait_for_selector('#attnlab-view[data-overview-ready="1"]')
            page.check("#overlay-heads input[data-head='1']") if page.get_attribute(
                "#attnlab-view", "data-head") != "1" else None
            page.hover('.token.query[data-index="12"]')
            page.screenshot(path=str(DOCS / "decoder-view.png"), full_page=False)
            browser.close()


def shoot(page_path: Path, target: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 820})
        page.goto(page_path.as_uri())
        page.wait_for_selector('#attnlab-view[data-overview-ready="1"]')
        # Layer 4, head 2 links "it" to "animal" (0.68): seed 001's pronoun example
        # (`attnlab inspect --find "it->animal"` finds it).
        page.select_option("#layer-select", index=3)
        page.select_option("#head-select", index=1)
        page.hover('.token.query[data-index="10"]')  # "it"
        page.screenshot(path=str(target), full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
