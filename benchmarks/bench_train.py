"""The bars of ``attnlab train``: whole-process time and the numbers each default run reaches.

Runs the command line exactly as a user would, one process per task, with torch's
threads pinned (``--threads``), and reads back metrics.json:

- ``attnlab train sort``: held-out exact match 1.0 on >= 5000 held-out examples,
  in <= 120 s;
- ``attnlab train induction``: the best induction score in the second layer
  (layer 1, counting from 0 as TransformerLens does) > 0.4, a previous-token head in
  the first layer (layer 0) > 0.4, the held-out loss on the repeat far
  below the first copy's (here: < 1/4 of it), in <= 300 s; and the ablation check
  (the induction head ablated vs a control head of the same layer).

Each run is timed from process start to exit (imports included): wall time, and
the CPU time of the process (user + system), which is steadier on a shared machine.
``--repeat`` runs the same seed again and checks that metrics.json is the same but
for the seconds.

    python benchmarks/bench_train.py                    # 1 thread, sort and induction
    python benchmarks/bench_train.py --threads 2 --tasks sort --repeat
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARS = {"sort": 120.0, "induction": 300.0}


def _run(task: str, threads: int, out: Path) -> tuple[float, float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "attnlab", "train", task, "--threads", str(threads),
         "--out", str(out)], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"attnlab train {task} failed: {done.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(done.stdout.rstrip())
    return wall, cpu, json.loads((out / "metrics.json").read_text(encoding="utf-8"))


def _check(task: str, wall: float, metrics: dict) -> list[tuple[str, str, bool]]:
    checks = [(f"whole process <= {BARS[task]:.0f} s", f"{wall:.1f} s", wall <= BARS[task])]
    if task == "sort":
        acc, n = metrics["heldout_accuracy"], metrics["heldout_examples"]
        checks.append(("held-out exact match 1.0 on >= 5000", f"{acc} on {n}",
                       acc == 1.0 and n >= 5000))
    else:
        induction = max(metrics["head_scores"]["induction"][1])
        previous = max(metrics["head_scores"]["previous_token"][0])
        first, second = metrics["first_half_loss"], metrics["second_half_loss"]
        checks += [
            ("best induction score in layer 1 (0-based) > 0.4", f"{induction:.3f}",
             induction > 0.4),
            ("a previous-token head in layer 0 > 0.4", f"{previous:.3f}", previous > 0.4),
            ("repeat loss < first copy's / 4", f"{second:.3f} vs {first:.3f}",
             second < first / 4),
        ]
        found = metrics["ablation"]
        ind, other = found["induction_heads_ablated"], found["other_heads_ablated"]
        checks.append(("ablating the induction heads sends the repeat's loss up, the others "
                       "do not (zero: induction > 4x other)",
                       f"induction heads {found['induction_heads']}: zero {ind['zero']:.3f}, "
                       f"mean {ind['mean']:.3f}; other heads {found['other_heads']}: zero "
                       f"{other['zero']:.3f}, mean {other['mean']:.3f}; none "
                       f"{found['none']['second_half_loss']:.3f}",
                       ind["zero"] > 4 * other["zero"]))
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tasks", nargs="+", default=["sort", "induction"],
                        choices=sorted(BARS))
    parser.add_argument("--repeat", action="store_true",
                        help="run each task twice and compare metrics.json")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            wall, cpu, metrics = _run(task, args.threads, Path(tmp) / task)
            print(f"\n## attnlab train {task}: {wall:.1f} s wall, {cpu:.1f} s CPU "
                  f"(training loop {metrics['seconds']:.1f} s)")
            for what, got, ok in _check(task, wall, metrics):
                print(f"  {'PASS' if ok else 'FAIL'}  {what}: {got}")
                failed |= not ok
            if args.repeat:
                _, _, again = _run(task, args.threads, Path(tmp) / f"{task}-again")
                same = {k: v for k, v in metrics.items() if k != "seconds"} == \
                    {k: v for k, v in again.items() if k != "seconds"}
                print(f"  {'PASS' if same else 'FAIL'}  same seed, same metrics.json")
                failed |= not same
            print(f"  load average now {os.getloadavg()[0]:.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
