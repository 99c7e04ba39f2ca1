"""The per-architecture table of docs/hf.md: each model's largest error against attnlab's
float64 plain path, from ``attnlab.hf.verify``.

The models: the real all-MiniLM-L6-v2 and the small random models of tests/hf
(BERT, GPT-2, Llama, Qwen2, Mistral with a sliding window of 4, Gemma 2 with a soft
cap, GPT-OSS with sinks, Phi-3), float32, a left-padded batch of two sentences
(MiniLM, BERT: right-padded, as their tokenizer pads). Columns: the largest error of
the hidden states over all layers and real tokens for eager, sdpa and attnlab's
fused path, of the weights for eager and attnlab (worst layer and head), and the
verdict of FlashAttention's 2× rule for sdpa and attnlab.

    PYTHONPATH=src:. .venv/bin/python scripts/hf_error_table.py
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _worst(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return "—" if not known else f"{max(known):.1e}"


def main() -> int:
    import torch
    import transformers
    from tests.hf import tiny_models as tm

    from attnlab.hf import verify

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    rows = ["| model | eager | sdpa | attnlab | weights eager | weights attnlab | verdict sdpa "
            "| verdict attnlab |", "|---|---|---|---|---|---|---|---|"]
    models = [("all-MiniLM-L6-v2 (real)", lambda: tm.load_minilm("eager"), "right")]
    models += [(arch, lambda arch=arch: tm.load(arch, "eager"),
                "right" if arch == "bert" else "left") for arch in tm.ARCHITECTURES]
    for label, load, side in models:
        report = verify(load(), tm.batch(side))
        hidden = {name: _worst([e.hidden[name] for e in report.layers])
                  for name in ("eager", "sdpa", "attnlab")}
        weights = {name: _worst([max(e.pattern[name]) for e in report.layers
                                 if name in e.pattern]) for name in ("eager", "attnlab")}
        rows.append(f"| {label} | {hidden['eager']} | {hidden['sdpa']} | {hidden['attnlab']} | "
                    f"{weights['eager']} | {weights['attnlab']} | {report.verdict['sdpa']} | "
                    f"{report.verdict['attnlab']} |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
