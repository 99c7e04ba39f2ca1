"""``attnlab bench --roofline``: tiny sizes end to end, and the bound arithmetic.

Correctness only (no timing is asserted): files written, every path present, its
work counted by the formulas written out here, its bounds and share derived from
the measured peaks as the module's docstring says, tables in English and Chinese.
"""

from __future__ import annotations

import json

import pytest

from attnlab.cli.app import main
from attnlab.studies.roofline import PathRecord, Peaks, RooflineConfig, RooflineResult
from attnlab.studies.roofline_report import format_roofline

pytest.importorskip("threadpoolctl")
pytest.importorskip("matplotlib")

PATHS = ["sdpa (plain)", "flash forward", "flash backward", "flash varlen", "sliding window",
         "KV-cache decode step"]


def test_tiny_roofline_end_to_end_in_chinese(tmp_path, capsys):
    code = main(["bench", "--roofline", "--quick", "--repeats", "2", "--lang", "zh",
                 "--cpu-time", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert code == 0
    assert "本机峰值" in captured.out and "受限于" in captured.out and "占上限比例" in captured.out
    assert "CPU 时间" in captured.out
    for name in ("roofline.json", "roofline.txt", "roofline.png"):
        assert (tmp_path / name).stat().st_size > 0
        assert f"已写入 {tmp_path / name}" in captured.err
    assert (tmp_path / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "roofline.txt").read_text(encoding="utf-8") == captured.out

    data = json.loads((tmp_path / "roofline.json").read_text())
    cfg, peaks = data["config"], data["peaks"]
    assert cfg["repeats"] == 2 and cfg["threads"] == 1 and cfg["cpu_time"] is True
    assert all(peaks[key] > 0 for key in ("gemm_gflops", "exp_per_second", "bandwidth_gbs"))
    by_name = {p["name"]: p for p in data["paths"]}
    assert [n for n in by_name if n in PATHS] == PATHS  # the twin only where torch is installed

    H, D = cfg["heads"], cfg["head_dim"]
    T = cfg["flash_len"]
    assert by_name["flash forward"]["flops"] == 4 * H * T * T * D
    T = cfg["backward_len"]
    assert by_name["flash backward"]["flops"] == 2.5 * 4 * H * T * T * D
    T, W = cfg["window_len"], cfg["window"]
    allowed_pairs = sum(len(range(max(0, i - W + 1), i + 1)) for i in range(T))
    assert by_name["sliding window"]["flops"] == 4 * H * allowed_pairs * D
    assert by_name["flash varlen"]["exps"] == H * sum(n * n for n in cfg["varlen_lengths"])
    S = cfg["decode_context"]
    assert by_name["KV-cache decode step"]["bytes"] == 2 * H * S * D * 4  # K and V, float32

    for p in data["paths"]:
        bounds = {"sgemm": p["flops"] / (peaks["gemm_gflops"] * 1e9),
                  "exp": p["exps"] / peaks["exp_per_second"],
                  "memory": p["bytes"] / (peaks["bandwidth_gbs"] * 1e9)}
        for key, value in bounds.items():
            assert p["bounds"][key] == pytest.approx(value, rel=1e-12)
        assert p["limit"] == max(bounds, key=bounds.__getitem__)
        assert p["share"] == pytest.approx(bounds[p["limit"]] / p["seconds"], rel=1e-12)
        assert p["seconds_min"] <= p["seconds"] <= p["seconds_max"]
        assert p["gflops"] == pytest.approx(p["flops"] / p["seconds"] / 1e9, rel=1e-12)


def test_english_table_from_a_result():
    record = PathRecord("flash forward", "H8 T=S=2048 D64", 8.6e9, 3.4e7, 1.8e7, 0.2, 0.19,
                        0.21, {"sgemm": 0.1, "exp": 0.05, "memory": 0.001}, "sgemm", 0.5)
    result = RooflineResult(RooflineConfig(), Peaks(86.0, 6.8e8, 12.5), [record], {},
                            (1.0, 0.5, 0.25), 3.0)
    table = format_roofline(result)
    assert "sgemm 86.0 GFLOP/s · exp 0.68 G/s · memory bandwidth 12.5 GB/s" in table
    assert "wall time" in table and "load average 1.00 0.50 0.25" in table
    row = next(line for line in table.splitlines() if line.startswith("flash forward"))
    # 8.6 GFLOP in 0.2 s: 43.0 GFLOP/s; 18 MB: 0.09 GB/s
    assert row.split()[-5:] == ["200.00", "43.0", "0.09", "sgemm", "0.50"]


def test_roofline_option_errors_are_one_line(capsys, tmp_path):
    code = main(["bench", "--roofline", "--threads", "0", "--out", str(tmp_path / "never")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "--threads: expected an integer >= 1, got 0" in err
    assert not (tmp_path / "never").exists()
