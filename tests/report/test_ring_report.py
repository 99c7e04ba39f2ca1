"""The virtual ring's report in English and Chinese, its picture, ``attnlab ring --simulate``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.cli.app import main
from attnlab.distributed import simulate
from attnlab.report.ring import ring_figure, ring_text


def _report(layout, is_causal=True, W=4):
    q = np.random.default_rng(0).standard_normal((1, 2, 16, 4))
    return simulate(q, q, q, world_size=W, layout=layout, is_causal=is_causal).report


def test_text_in_english():
    text = ring_text(_report("contiguous"))
    assert "W = 4 ranks, contiguous layout, causal, T = 16 (4 positions per rank)" in text
    assert "rank 3 holds positions 12–15" in text
    # step 1: rank 0 would meet rank 3's later keys, all hidden by the causal mask
    assert "rank 0 · K/V of rank 3 · skipped" in text
    assert "rank 3 · K/V of rank 2 · 16 scores in a 4×4 block" in text
    # per-rank totals, counted by hand: 10, 10 + 16, 10 + 32, 10 + 48
    assert text.splitlines()[-5].split()[-1] == "58"
    assert "work imbalance (max / min rank): 5.80" in text
    assert "3 K/V shards of 512 B = 1.5 KiB" in text  # B·Hkv·n·(D + Dv) = 64 float64


def test_text_in_chinese_and_layouts():
    zh = ring_text(_report("zigzag"), "zh")
    assert "之字形" in zh and "进程 0 持有位置 0–1, 14–15" in zh
    assert "工作量不均衡度（最多 / 最少的进程）：1.00" in zh
    striped = ring_text(_report("striped"), detail=False)
    assert "rank 1 holds positions 1, 5, …, 13" in striped and "step 0\n" not in striped
    assert "no mask" in ring_text(_report("zigzag", is_causal=False))


def test_figure_shows_every_cell():
    report = _report("contiguous")
    fig = ring_figure(report, "zh")
    grid = fig.axes[0]
    labels = [t.get_text() for t in grid.texts]
    assert len(labels) == 16 and labels.count("–") == 6  # 6 skipped cells of 16
    work = report.work()
    assert labels[3 * 4 + 3] == str(work[3, 3])


def test_cli_simulate(capsys, tmp_path):
    code = main(["ring", "--world-size", "4", "--seq", "32", "--heads", "2", "--layout",
                 "zigzag", "--causal", "--simulate", "--lang", "zh", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "环形注意力" in out and "与单进程 flash 注意力的最大误差" in out
    error = float(out.rsplit(":", 1)[1])
    assert error < 1e-6  # float32 inputs, float32 merges
    assert (tmp_path / "ring.png").stat().st_size > 0 and "ring.png" in err
    code = main(["ring", "--world-size", "3", "--seq", "12", "--heads", "2", "--layout",
                 "striped", "--simulate", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and len(data["work"]) == 3 and data["imbalance"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--seq", "30"], "--seq: the zigzag layout cuts the sequence into 2W = 8 equal chunks"),
    (["--heads", "4", "--kv-heads", "3"], "--kv-heads: expected a divisor of --heads 4"),
    (["--world-size", "0"], "--world-size: expected a positive integer"),
])
def test_cli_errors(capsys, args, message):
    code = main(["ring", "--simulate", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
