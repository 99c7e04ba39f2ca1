"""Hook points cost nothing when unused: MiniLM ``encode`` (NumPy) and torch
``MultiHeadAttention`` with no hook attached, this tree against the tree before hook
points existed, in one run.

The older tree is exported with ``git archive`` (default: the parent of the commit that
introduced ``attnlab/hooks.py``) into a temporary directory. Each round runs one child
process per tree (alternating which goes first), each timing the same calls on one
thread; the script prints the median of each and their ratio (after / before: 1.00 =
as fast; timing noise on a shared machine is a few percent).

    .venv/bin/python benchmarks/bench_hooks.py --rounds 5
    .venv/bin/python benchmarks/bench_hooks.py --before <commit>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(1)
from attnlab.models import load_minilm
from attnlab.torch import MultiHeadAttention

reps = int(sys.argv[1])
model = load_minilm()
texts = ["Attention lets every token look at every other token in the sentence."] * 16 + [
    "自注意力机制让每个词都能关注句子中的所有其他词。"] * 16
model.encode(texts)  # warm-up

def best(fn, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)

torch.manual_seed(0)
mha = MultiHeadAttention(8, 256).eval()
x = torch.randn(8, 128, 256)
with torch.no_grad():
    mha(x, x, x)
    small = torch.randn(1, 8, 256)
    out = {
        "minilm encode, 32 texts": best(lambda: model.encode(texts), reps),
        "minilm encode, 32 texts, pack=False": best(
            lambda: model.encode(texts, pack=False), reps),
        "torch MHA (8, 128, 256)": best(lambda: mha(x, x, x), reps * 10),
        "torch MHA (1, 8, 256)": best(lambda: mha(small, small, small), reps * 200),
    }
print(json.dumps(out))
"""


def _introducing_commit() -> str:
    found = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "src/attnlab/hooks.py"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not found:
        sys.exit("bench_hooks: src/attnlab/hooks.py has no adding commit; pass --before")
    return found[-1] + "^"


def _export(rev: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "src"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    tar_path = into / "before.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _run(src: Path, reps: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", CHILD, str(reps)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="the commit to compare with (default: the parent "
                        "of the commit that added src/attnlab/hooks.py)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5, help="calls per timing (best of)")
    args = parser.parse_args()
    rev = args.before or _introducing_commit()
    with tempfile.TemporaryDirectory() as tmp:
        before_src = _export(rev, Path(tmp))
        sides = {"before": before_src, "after": ROOT / "src"}
        results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for round_index in range(args.rounds):
            order = ["before", "after"] if round_index % 2 == 0 else ["after", "before"]
            for side in order:
                results[side].append(_run(sides[side], args.reps))
    print(f"before = {rev}, after = this tree; median over {args.rounds} rounds of the "
          f"best of {args.reps}+ calls, 1 thread")
    print(f"{'call':<40}{'before':>12}{'after':>12}{'after/before':>14}")
    for key in results["before"][0]:
        before = statistics.median(r[key] for r in results["before"])
        after = statistics.median(r[key] for r in results["after"])
        print(f"{key:<40}{before * 1e3:>10.3f}ms{after * 1e3:>10.3f}ms{after / before:>13.3f}x")


if __name__ == "__main__":
    main()
