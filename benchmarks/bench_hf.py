"""A small Llama on ``attn_implementation="attnlab"`` against transformers' own ``"sdpa"``,
and the cost of reading one layer's pattern with ``run_with_cache``.

The model: a random Llama (4 layers, width 256, 8 query heads sharing 4 key/value
heads, head dim 32, vocabulary 1000), built from its config with a fixed seed; one
sequence of T = ``--seq`` (512) tokens, float32, forward only, no gradients, on CPU
with torch held to ``--threads`` threads (1 by default). The runs are interleaved
(A B, then B A, ...) so that drift in the machine's load hits both; printed: the
median of ``--repeats`` runs, the spread (min .. max) and the ratio of medians.
Outputs are checked to agree before anything is timed.

    .venv/bin/python benchmarks/bench_hf.py
    .venv/bin/python benchmarks/bench_hf.py --seq 1024 --threads 2 --repeats 15

Rows: "attnlab vs sdpa" (target <= 1.05x), "run_with_cache(blocks.1.attn.hook_pattern)
vs the plain call" (both on attnlab: the one layer whose (T, S) weights are built
by the plain steps, the others fused).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _model(implementation: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=4096)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation(implementation)
    return model


def _interleaved(a: Callable[[], object], b: Callable[[], object],
                 repeats: int) -> tuple[list[float], list[float]]:
    times_a, times_b = [], []
    for i in range(repeats):
        for fn, times in ((a, times_a), (b, times_b)) if i % 2 == 0 else \
                ((b, times_b), (a, times_a)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return times_a, times_b


def _row(label: str, times_a: list[float], times_b: list[float], names: tuple[str, str]) -> str:
    med_a, med_b = statistics.median(times_a), statistics.median(times_b)
    return (f"{label:<58} {names[0]} {med_a * 1e3:7.1f} ms ({min(times_a) * 1e3:.1f} .. "
            f"{max(times_a) * 1e3:.1f})   {names[1]} {med_b * 1e3:7.1f} ms "
            f"({min(times_b) * 1e3:.1f} .. {max(times_b) * 1e3:.1f})   ratio {med_a / med_b:.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=11)
    args = parser.parse_args()

    import torch

    import attnlab.hf
    from attnlab.lens import run_with_cache

    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        attnlab.hf.register("attnlab")
        ours, theirs = _model("attnlab"), _model("sdpa")
        ids = torch.randint(0, 1000, (1, args.seq), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            a, b = ours(input_ids=ids).logits, theirs(input_ids=ids).logits
            error = (a - b).abs().max().item()
            assert error < 1e-4, f"attnlab and sdpa disagree by {error:.2e}"
            _, cache = run_with_cache(ours, input_ids=ids, names=["blocks.1.attn.hook_pattern"])
            assert cache["blocks.1.attn.hook_pattern"].shape == (1, 8, args.seq, args.seq)

            def plain_ours() -> object:
                return ours(input_ids=ids)

            def plain_theirs() -> object:
                return theirs(input_ids=ids)

            def cached() -> object:
                return run_with_cache(ours, input_ids=ids, names=["blocks.1.attn.hook_pattern"])

            print(f"Llama 4 layers, width 256, 8/4 heads, T = {args.seq}, float32, "
                  f"{args.threads} torch thread(s), {args.repeats} interleaved runs; "
                  f"max |logits attnlab - sdpa| = {error:.1e}")
            print(_row("forward: attnlab vs sdpa", *_interleaved(plain_ours, plain_theirs,
                                                                  args.repeats),
                       ("attnlab", "sdpa")))
            print(_row("run_with_cache(blocks.1.attn.hook_pattern) vs none (attnlab)",
                       *_interleaved(cached, plain_ours, args.repeats), ("cache", "none")))
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    main()
