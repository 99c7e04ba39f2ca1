"""A training step of attnlab.torch layers, eager vs torch.compile (inductor), on CPU.

A stack of ``attnlab.torch.SelfAttentionLayer`` (pre-LN, causal) trains on random
data with AdamW; the same step runs eagerly and compiled with
``torch.compile(forward, fullgraph=True)`` (forward and loss; AOTAutograd compiles
the backward) (which fails if attnlab breaks the graph).
The script prints the compile time once, then the median step time of each over
interleaved repeats and their ratio (target: compiled at least as fast as eager,
ratio <= 1.0), after checking that both give the same losses on the first steps.

    .venv/bin/python benchmarks/bench_compile.py --threads 1 --layers 2 --seq 128
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import attnlab.torch as at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stock", action="store_true",
                        help="time torch's own nn.TransformerEncoderLayer instead (pre-LN, "
                        "same sizes, feed-forward 4E), as the yardstick for what compiling "
                        "gains on this CPU")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    causal = torch.nn.Transformer.generate_square_subsequent_mask(args.seq)

    def build() -> torch.nn.Module:
        if args.stock:
            return torch.nn.Sequential(*[
                torch.nn.TransformerEncoderLayer(args.d_model, args.heads, 4 * args.d_model,
                                                 dropout=0.0, batch_first=True,
                                                 norm_first=True)
                for _ in range(args.layers)])
        return torch.nn.Sequential(*[
            at.SelfAttentionLayer(args.d_model, args.heads, dropout=0.0, norm="pre")
            for _ in range(args.layers)])

    eager_model = build()
    compiled_model = copy.deepcopy(eager_model)
    x = torch.randn(args.batch, args.seq, args.d_model)
    target = torch.randn(args.batch, args.seq, args.d_model)

    def make_step(model: torch.nn.Module):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def forward() -> torch.Tensor:  # compiled whole; its backward by AOTAutograd
            out = x
            for layer in model:
                out = (layer(out, src_mask=causal, is_causal=True) if args.stock
                       else layer(out, is_causal=True))
            return torch.nn.functional.mse_loss(out, target)

        def step(fwd=forward) -> float:
            optimizer.zero_grad(set_to_none=True)
            loss = fwd()
            loss.backward()
            optimizer.step()
            return float(loss.detach())

        return step, forward, optimizer

    eager_step, _, _ = make_step(eager_model)
    _, forward, optimizer = make_step(compiled_model)
    compiled_forward = torch.compile(forward, fullgraph=True)

    def step_compiled() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = compiled_forward()
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    started = time.perf_counter()
    first = step_compiled()
    compile_s = time.perf_counter() - started
    reference = eager_step()
    if abs(first - reference) > 1e-5 * max(1.0, abs(reference)):
        raise SystemExit(f"compiled and eager losses differ: {first} vs {reference}")
    eager_times, compiled_times = [], []
    for repeat in range(args.repeats):
        pair = [("eager", eager_step), ("compiled", step_compiled)]
        if repeat % 2:
            pair.reverse()
        for name, fn in pair:
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            (eager_times if name == "eager" else compiled_times).append(
                (time.perf_counter() - t0) / args.steps)
    eager_ms = statistics.median(eager_times) * 1e3
    compiled_ms = statistics.median(compiled_times) * 1e3
    what = "nn.TransformerEncoderLayer" if args.stock else "SelfAttentionLayer"
    print(f"torch {torch.__version__}, {args.threads} thread(s); {args.layers} x "
          f"{what}(E={args.d_model}, H={args.heads}, pre-LN, causal), "
          f"B={args.batch}, T={args.seq}, AdamW")
    print(f"compile (first step): {compile_s:.1f} s")
    print(f"step: eager {eager_ms:.2f} ms, compiled {compiled_ms:.2f} ms, "
          f"compiled / eager = {compiled_ms / eager_ms:.3f}x (median of {args.repeats} "
          f"interleaved repeats of {args.steps} steps)")


if __name__ == "__main__":
    main()
