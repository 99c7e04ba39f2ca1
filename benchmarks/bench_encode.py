"""Throughput of MiniLM sentence embeddings: attnlab's NumPy path vs sentence-transformers.

Both encode the same 64 sentences into the same normalised embeddings, in
batches of the same size, with the same number of threads (NumPy's BLAS limited
by threadpoolctl, torch by torch.set_num_threads), in interleaved runs; the
script prints the median and spread of each and their ratio (target >= 1.0x).

Both sort the texts by length and pad each batch to its longest member; attnlab
sorts by token count, sentence-transformers by character count, so their
batches can differ. The script prints the token positions each side computes
(real tokens plus padding) so that the difference in work is in plain view.

    .venv/bin/python benchmarks/bench_encode.py --threads 1 --repeats 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SENTENCES = [
    "小明去了学校。", "The cat sat on the mat.",
    "Self-attention relates every token to every other.",
    "A man is playing a guitar on the street.", "北京是中国的首都。",
    "I love NLP and transformers.",
    "The weather is lovely today, let's go for a walk in the park.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "She went to the bank to deposit her paycheck before it closed.",
    "机器学习和深度学习有什么区别？", "Two dogs are running through a field of tall grass.",
    "def attention(q, k, v): return softmax(q @ k.T / sqrt(d)) @ v",
    "The quick brown fox jumps over the lazy dog.", "Is this the real life? Is this just fantasy?",
    "今天天气很好，我们去公园散步吧！", "Attention weights in each row sum to one.",
]
SENTENCES = (SENTENCES * 4)[:64]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from threadpoolctl import threadpool_limits

    from attnlab.models import load_minilm, minilm_path

    torch.set_num_threads(args.threads)
    ours = load_minilm()
    reference = SentenceTransformer(str(minilm_path()), device="cpu")

    def run_ours() -> None:
        ours.encode(SENTENCES, batch_size=args.batch_size)

    def run_reference() -> None:
        with torch.inference_mode():
            reference.encode(SENTENCES, batch_size=args.batch_size, normalize_embeddings=True,
                             show_progress_bar=False)

    lengths = [len(e.ids) for e in ours.tokenizer.encode_batch(SENTENCES)]
    by_tokens = sorted(lengths, reverse=True)
    # sentence-transformers' order: np.argsort of minus the character counts.
    by_chars = [lengths[i] for i in np.argsort([-len(text) for text in SENTENCES])]
    positions = {name: sum(len(batch[i: i + args.batch_size]) * max(batch[i: i + args.batch_size])
                           for i in range(0, len(batch), args.batch_size))
                 for name, batch in (("attnlab", by_tokens), ("st", by_chars))}

    times: dict[str, list[float]] = {"attnlab (NumPy)": [], "sentence-transformers": []}
    with threadpool_limits(limits=args.threads):
        run_ours(), run_reference()  # warm-up: caches, thread pools, lazy init
        for _ in range(args.repeats):  # interleaved, so drift hits both alike
            for name, fn in (("attnlab (NumPy)", run_ours), ("sentence-transformers",
                                                             run_reference)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)

    print(f"encode 64 sentences, batch {args.batch_size}, {args.threads} thread(s), "
          f"{args.repeats} interleaved runs")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:24s} median {med * 1e3:7.1f} ms  (min {min(values) * 1e3:.1f}, "
              f"max {max(values) * 1e3:.1f})  {64 / med:6.1f} sentences/s")
    print(f"  token positions computed (real + padding): attnlab {positions['attnlab']} "
          f"(sorted by tokens), sentence-transformers {positions['st']} (sorted by "
          f"characters); {sum(lengths)} real")
    ratio = statistics.median(times["sentence-transformers"]) / statistics.median(
        times["attnlab (NumPy)"])
    print(f"throughput ratio attnlab / sentence-transformers = {ratio:.2f}x (target >= 1.0x)")


if __name__ == "__main__":
    main()
