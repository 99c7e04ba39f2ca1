"""The approximation study end to end, on a tiny configuration (no timing assertions)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab import AttnlabError
from attnlab.cli.app import main
from attnlab.studies.approx import SCHEMA, StudyConfig, capture_minilm_qkv, run_study
from attnlab.studies.approx_methods import METHODS
from attnlab.studies.approx_report import format_table, save_study

TINY = StudyConfig(
    lengths=(48,), head_dim=8, windows=(5, 95), block_sizes=(8,), linformer_k=(8,),
    nystrom_m=(6,), performer_features=(16,), minilm=False, long_length=64, long_window=8,
    repeats=1, threads=None,
)

RECORD_KEYS = {"input", "T", "B", "D", "method", "knob", "value", "rel_error", "time_s",
               "peak_bytes", "time_vs_exact", "memory_vs_exact"}


@pytest.fixture(scope="module")
def tiny_result():
    return run_study(TINY)


def test_result_schema(tiny_result):
    result = tiny_result
    assert result["schema"] == SCHEMA
    assert set(result) == {"schema", "config", "environment", "inputs", "records",
                           "long_sequence", "summary"}
    assert {i["input"] for i in result["inputs"]} == {"gaussian-uniform", "gaussian-peaked"}
    for record in result["records"]:
        assert set(record) == RECORD_KEYS
        assert record["rel_error"] >= 0 and record["time_s"] > 0 and record["peak_bytes"] >= 0
    methods = {r["method"] for r in result["records"]}
    assert methods == {"exact"} | {m.name for m in METHODS}
    # One record per input × method × knob value (W = 95 ≥ 2T - 1 is skipped: it is exact).
    per_input = [r for r in result["records"] if r["input"] == "gaussian-peaked"]
    assert sorted((r["method"], r["value"]) for r in per_input if r["method"] != "exact") == [
        ("block_sparse", 8), ("linformer", 8), ("linformer_pool", 8), ("nystrom", 6),
        ("performer", 16), ("sliding_window", 5)]
    for name, entry in result["summary"].items():
        assert name in methods and "exact attention" not in entry["statement"][:0]
        assert "relative error" in entry["statement"]
        assert set(entry) == {"statement", "worst_error", "worse_than_mean_v", "slower",
                              "more_memory", "faster_from_T"}


def test_the_inputs_are_what_they_claim(tiny_result):
    """Near-uniform rows spread their weight; peaked rows put much of it on one key."""
    stats = {i["input"]: i for i in tiny_result["inputs"]}
    assert stats["gaussian-uniform"]["normalised_entropy"] > 0.9
    assert stats["gaussian-peaked"]["normalised_entropy"] < 0.6
    assert stats["gaussian-peaked"]["mean_max_weight"] > 5 * stats["gaussian-uniform"][
        "mean_max_weight"]


def test_errors_are_measured_against_exact_attention(tiny_result):
    records = tiny_result["records"]
    for r in records:
        if r["method"] == "exact":
            assert r["rel_error"] == 0 and r["time_vs_exact"] == 1
    # The approximations are not exact at these settings; a tiny window misses a lot.
    window = [r for r in records if r["method"] == "sliding_window"]
    assert all(r["rel_error"] > 1e-3 for r in window)


def test_long_sequence_section(tiny_result):
    long = tiny_result["long_sequence"]
    assert long["T"] == 64 and long["dense"]["runs"] == 1
    assert [m["method"] for m in long["methods"]] == ["sliding_window", "block_sparse",
                                                      "performer"]
    assert set(long["target"]) == {"method", "W", "required_speedup", "speedup", "met"}
    assert all(m["speedup_vs_dense"] > 0 for m in long["methods"])


def test_save_study_writes_json_and_plots(tiny_result, tmp_path):
    written = save_study(tiny_result, tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == ["approx.json", "error_vs_memory.png", "error_vs_time.png", "patterns.png",
                     "time_vs_length.png"]
    for path in written:
        assert path.stat().st_size > 0
    data = json.loads((tmp_path / "out" / "approx.json").read_text(encoding="utf-8"))
    assert data["schema"] == SCHEMA and len(data["records"]) == len(tiny_result["records"])
    assert (tmp_path / "out" / "patterns.png").read_bytes()[:4] == b"\x89PNG"


def test_format_table_lists_every_record(tiny_result):
    table = format_table(tiny_result)
    assert table.count("\n") >= len(tiny_result["records"])
    assert "Where each method is worse than exact attention:" in table
    assert "target W=8" in table


def test_config_validation():
    with pytest.raises(AttnlabError, match="windows: expected odd"):
        run_study(StudyConfig(windows=(4,), minilm=False, long_length=None))
    with pytest.raises(AttnlabError, match="minilm_lengths: expected at most 256"):
        run_study(StudyConfig(minilm_lengths=(512,), long_length=None))
    with pytest.raises(AttnlabError, match="lengths: expected a tuple of positive integers"):
        run_study(StudyConfig(lengths=(0,), minilm=False))


def test_minilm_capture_is_real_qkv():
    q, k, v, tokens = capture_minilm_qkv(40)
    assert q.shape == k.shape == v.shape == (6 * 12, 40, 32)  # layers × heads, T, D
    assert tokens[0] == "[CLS]" and tokens[1] == "the" and len(tokens) == 40
    assert np.isfinite(q).all() and q.std() > 0.1  # real activations, not zeros


def test_cli_tiny_run(capsys):
    """The table goes to stdout, progress to stderr (files: see test_save_study_...)."""
    code = main(["approx", "--lengths", "40", "--no-minilm", "--long", "0", "--repeats", "1",
                 "--threads", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "sliding_window" in captured.out and "performer" in captured.out
    assert "Where each method is worse" in captured.out
    assert "... gaussian-peaked T=40: nystrom m=16" in captured.err
    assert "pass --out DIR" in captured.err


def test_cli_bad_lengths_is_one_line_error(capsys):
    code = main(["approx", "--lengths", "0,x"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--lengths" in err


def test_lengths_beyond_exact_attention_fail_at_once(capsys, tmp_path):
    """Before: the whole study ran, then a MemoryError (an internal error, exit 1)."""
    with pytest.raises(AttnlabError, match=r"long_length: exact attention at T = 100000 needs"):
        StudyConfig(long_length=100_000).check()
    with pytest.raises(AttnlabError, match=r"lengths: .* expected T <= 46340"):
        StudyConfig(lengths=(46_341,)).check()
    code = main(["approx", "--quick", "--no-minilm", "--long", "100000000000"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "long_length: exact attention" in err
    (tmp_path / "file").write_text("")
    code = main(["approx", "--lengths", "40", "--no-minilm", "--out", str(tmp_path / "file")])
    err = capsys.readouterr().err  # refused before the study, not after it
    assert code == 2 and err == f"error: --out: expected a folder, got {tmp_path / 'file'}, " \
                                "which is a file\n"
