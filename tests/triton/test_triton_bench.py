"""benchmarks/bench_triton.py runs end to end (its --dry-run: CPU, Triton's interpreter,
tiny shapes) and writes the JSON it promises. Timings are not asserted: benchmarks measure,
tests check that they run and report what they say."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_triton.py"


def test_the_dry_run_prints_the_table_and_writes_the_json(tmp_path):
    out = tmp_path / "bench.json"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--json", str(out)],
                            env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "D=  16 T=    64" in result.stdout and "attnlab.triton" in result.stdout
    report = json.loads(out.read_text())
    assert report["dry_run"] is True and report["skipped"] == []
    assert [(r["D"], r["T"], r["causal"]) for r in report["rows"]] == [(16, 64, True),
                                                                       (16, 64, False)]
    for row in report["rows"]:
        assert set(row["results"]) == {"attnlab.triton", "sdpa-flash", "flex"}
        for name, r in row["results"].items():
            assert r["max_abs_diff_vs_sdpa"] <= 2e-2, name  # the script's own check, float16
            assert r["fwd_ms"] > 0 and r["fwd_tflops"] > 0
        assert row["results"]["attnlab.triton"]["fwd_bwd_ms"] > 0
    mha = report["bench_torch_mha"]
    assert mha["returncode"] == 0 and "ratio attnlab/torch" in mha["stdout"], mha
    assert mha["command"][1:3] == ["--device", "cpu"]  # the same device as the grid


def test_a_cpu_run_without_the_interpreter_is_refused():
    spec = importlib.util.spec_from_file_location("bench_triton", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # not __main__: parses nothing, imports attnlab.triton
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu"])
    assert bench.parse_args(["--device", "cuda"]).lengths == [16384, 8192, 4096, 2048, 1024]


def test_the_verdict_reads_the_target_rows_and_flags_a_wrong_kernel():
    spec = importlib.util.spec_from_file_location("bench_triton", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def row(D, T, fwd, both, wrong=False):
        ours = {"wrong": True} if wrong else {"fwd_vs_sdpa": fwd, "fwd_bwd_vs_sdpa": both}
        return {"D": D, "T": T, "results": {"attnlab.triton": ours}}

    rows = [row(128, 4096, 0.9, 0.75), row(128, 16384, 0.82, 0.68), row(64, 4096, 0.1, 0.1),
            row(128, 2048, 0.2, 0.2)]  # only D = 128, T = 4k-16k count
    assert bench.verdict(rows) == {
        "rows": 2, "worst_fwd_vs_sdpa": 0.82, "fwd_target_0.8_met": True,
        "worst_fwd_bwd_vs_sdpa": 0.68, "fwd_bwd_target_0.7_met": False,
    }
    assert bench.verdict([row(128, 8192, 0, 0, wrong=True)]) == {"rows": 1, "wrong": True}
    assert bench.verdict([row(64, 8192, 1, 1)]) == {"rows": 0}
