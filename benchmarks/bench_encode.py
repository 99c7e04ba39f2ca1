"""Throughput of MiniLM sentence embeddings: attnlab's NumPy path vs sentence-transformers,
and attnlab's packed batches vs its padded ones.

All three encode the same 64 sentences into the same normalised embeddings, in
batches of the same size, with the same number of threads (NumPy's BLAS limited
by threadpoolctl, torch by torch.set_num_threads), in interleaved runs; the
script prints the median and spread of each and the ratios (target >= 1.0x).

attnlab packed (``encode(pack=True)``, the default) puts each batch's sequences
one after another without padding (``BertModel.forward_packed``, varlen
attention): it computes the real tokens only. attnlab padded (``pack=False``)
and sentence-transformers pad each batch to its longest member; attnlab sorts
by token count, sentence-transformers by character count, so their batches can
differ. The script prints the token positions each side computes (real tokens
plus padding) so that the difference in work is in plain view.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sentences", type=int, default=64,
                        help="how many sentences (the 16 below, repeated)")
    args = parser.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from threadpoolctl import threadpool_limits

    from attnlab.models import load_minilm, minilm_path

    torch.set_num_threads(args.threads)
    ours = load_minilm()
    reference = SentenceTransformer(str(minilm_path()), device="cpu")

    sentences = (SENTENCES * (args.sentences // len(SENTENCES) + 1))[: args.sentences]
    n = len(sentences)

    def run_packed() -> None:
        ours.encode(sentences, batch_size=args.batch_size, pack=True)

    def run_padded() -> None:
        ours.encode(sentences, batch_size=args.batch_size, pack=False)

    def run_reference() -> None:
        with torch.inference_mode():
            reference.encode(sentences, batch_size=args.batch_size, normalize_embeddings=True,
                             show_progress_bar=False)

    lengths = [len(e.ids) for e in ours.tokenizer.encode_batch(sentences)]
    by_tokens = sorted(lengths, reverse=True)
    # sentence-transformers' order: np.argsort of minus the character counts.
    by_chars = [lengths[i] for i in np.argsort([-len(text) for text in sentences])]
    positions = {name: sum(len(batch[i: i + args.batch_size]) * max(batch[i: i + args.batch_size])
                           for i in range(0, len(batch), args.batch_size))
                 for name, batch in (("attnlab", by_tokens), ("st", by_chars))}

    runs = {"attnlab packed": run_packed, "attnlab padded": run_padded,
            "sentence-transformers": run_reference}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with threadpool_limits(limits=args.threads):
        for fn in runs.values():  # warm-up: caches, thread pools, lazy init
            fn()
        for _ in range(args.repeats):  # interleaved, so drift hits all alike
            for name, fn in runs.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)

    print(f"encode {n} sentences, batch {args.batch_size}, {args.threads} thread(s), "
          f"{args.repeats} interleaved runs")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"  {name:24s} median {med * 1e3:7.1f} ms  (min {min(values) * 1e3:.1f}, "
              f"max {max(values) * 1e3:.1f})  {n / med:6.1f} sentences/s")
    print(f"  token positions computed (real + padding): attnlab packed {sum(lengths)} "
          f"(no padding), attnlab padded {positions['attnlab']} (sorted by tokens), "
          f"sentence-transformers {positions['st']} (sorted by characters)")
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"throughput ratio attnlab packed / attnlab padded = "
          f"{median['attnlab padded'] / median['attnlab packed']:.2f}x")
    for name in ("attnlab packed", "attnlab padded"):
        print(f"throughput ratio {name} / sentence-transformers = "
              f"{median['sentence-transformers'] / median[name]:.2f}x (target >= 1.0x)")


if __name__ == "__main__":
    main()
