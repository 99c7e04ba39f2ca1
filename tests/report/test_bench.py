"""``attnlab bench`` and attnlab.studies.bench: a tiny configuration end to end, and the tools.

Correctness only: files written, JSON schema, table printed, errors, thread settings
restored, memory probes measuring what they say. No timing is asserted (benchmarks
measure; tests check correctness).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.cli.app import main
from attnlab.errors import AttnlabError
from attnlab.nn.decoder import DecoderConfig
from attnlab.studies.bench import attention_flops, run_benchmarks
from attnlab.studies.bench_config import CONTENDERS, BenchConfig
from attnlab.studies.bench_report import format_table
from attnlab.studies.bench_results import SCHEMA
from attnlab.studies.measure import (
    Timing,
    calls_per_sample,
    interleaved,
    limit_threads,
    peak_rss_bytes,
    peak_traced_bytes,
)

torch = pytest.importorskip("torch")
threadpoolctl = pytest.importorskip("threadpoolctl")

TINY = ["--quick", "--lengths", "16,40", "--heads", "2", "--head-dim", "8",
        "--contexts", "4,9", "--prompt-len", "5", "--new-tokens", "3", "--repeats", "3",
        "--generate-repeats", "1", "--min-time", "0", "--threads", "1"]


def run_cli(capsys, *args):
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_tiny_suite_end_to_end(tmp_path, capsys):
    code, out, err = run_cli(capsys, *TINY, "--out", str(tmp_path))
    assert code == 0
    # the table, on stdout
    for text in ("Attention forward", "GFLOP/s", "Peak extra memory", "Decode latency per token",
                 "Generate 3 tokens after a 5-token prompt", "same tokens: yes", *CONTENDERS):
        assert text in out
    # progress and what was written, on stderr
    assert "100%" in err and "attention T=16" in err
    names = ["results.json", "table.txt", "throughput.png", "memory.png", "decode_latency.png",
             "generate.png"]
    for name in names:
        path = tmp_path / name
        assert path.stat().st_size > 0 and f"wrote {path}" in err
        if name.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "table.txt").read_text() == out

    data = json.loads((tmp_path / "results.json").read_text())
    assert data["schema"] == SCHEMA
    assert set(data) == {"schema", "config", "environment", "seconds", "attention", "decode",
                         "decode_fit", "generate"}
    assert data["config"]["lengths"] == [16, 40] and data["config"]["threads"] == 1
    assert data["environment"]["threads"] == 1 and data["environment"]["numpy"] == np.__version__
    assert data["environment"]["blas_threads_in_use"] and all(
        n == 1 for n in data["environment"]["blas_threads_in_use"])

    records = data["attention"]
    assert [(r["contender"], r["T"]) for r in records] == [
        (c, T) for T in (16, 40) for c in CONTENDERS]
    for r in records:
        assert r["error"] is None, r
        assert r["flops"] == 4 * 1 * 2 * r["T"] * r["S"] * 8
        assert len(r["time"]["samples_s"]) == 3 and r["time"]["median_s"] > 0
        assert r["gflops_min"] <= r["gflops"] <= r["gflops_max"]
        assert isinstance(r["peak_bytes"], int) and r["peak_bytes"] >= 0
        assert r["memory_method"] == ("rss" if r["contender"].startswith(("torch", "attnlab"))
                                      else "tracemalloc")
        # every contender computed the same attention (float32 inputs)
        assert r["max_abs_diff"] < 1e-5

    decode = data["decode"]
    assert [d["context"] for d in decode] == [4, 9]
    for d in decode:
        assert len(d["cached"]["samples_s"]) == 3 and d["speedup"] > 0
        assert len(d["attend"]["samples_s"]) == 3
        assert d["max_abs_logit_diff"] < 1e-4  # cached step == recomputed step
    fit = data["decode_fit"]
    assert set(fit) == {"cached", "uncached", "attend"}
    assert set(fit["cached"]) == {"intercept_s", "seconds_per_context_token", "r2_linear",
                                  "loglog_exponent"}
    gen = data["generate"]
    assert gen["same_tokens"] is True and gen["new_tokens"] == 3 and gen["prompt_len"] == 5
    assert gen["speedup"] == pytest.approx(gen["uncached"]["median_s"] / gen["cached"]["median_s"])


def test_sections_and_no_plots(tmp_path, capsys):
    code, out, err = run_cli(capsys, *TINY, "--sections", "decode", "--no-plots",
                             "--no-progress", "--out", str(tmp_path))
    assert code == 0
    assert "Decode latency" in out and "Attention forward" not in out and "Generate" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json", "table.txt"]
    assert "%]" not in err
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["attention"] == [] and data["generate"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threads", "0"], "--threads: expected an integer >= 1, got 0"),
        (["--lengths", "a,b"], "--lengths: expected comma-separated integers"),
        (["--lengths", "0,16"], "--lengths: expected positive integers"),
        (["--contexts", ""], "--contexts: expected positive integers"),
        (["--contenders", "numpy_naive,cuda_magic"], "--contenders: expected names from"),
        (["--sections", "attention,nope"], "--sections: expected names from"),
        (["--repeats", "x"], "argument --repeats: invalid int value"),
        (["--min-time", "-1"], "--min-time: expected a number >= 0"),
        (["--new-tokens", "-2"], "--new-tokens: expected an integer >= 0"),
        (["--dtype", "float16"], "argument --dtype: invalid choice"),
    ],
)
def test_bad_options_are_one_line_errors(capsys, tmp_path, args, message):
    code, out, err = run_cli(capsys, *args, "--out", str(tmp_path / "never"))
    assert code == 2
    assert out == "" and err.count("\n") == 1 and err.startswith("error:")
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_api_progress_and_skipped_naive_contenders():
    config = BenchConfig(sections=("attention",), lengths=(8, 24), heads=1, head_dim=4,
                         repeats=2, min_time=0.0, max_memory=0.0, causal=True,
                         measure_memory=False)
    calls = []
    result = run_benchmarks(config, progress=lambda done, total, label: calls.append(
        (done, total, label)))
    done = [c[0] for c in calls]
    assert done == sorted(done) and calls[-1][0] == calls[-1][1]
    by = {(r.contender, r.T): r for r in result.attention}
    for T in (8, 24):
        assert by[("numpy_naive", T)].timing is None
        assert by[("numpy_naive", T)].error.startswith("skipped: needs")
        assert by[("torch_naive", T)].error.startswith("skipped")
        flash = by[("numpy_flash", T)]
        assert flash.timing is not None and flash.flops == attention_flops(1, 1, T, T, 4, True)
        assert flash.peak_bytes is None  # measure_memory=False
    table = format_table(result)
    assert "skipped" in table and "causal" in table
    json.loads(result.to_json())


def test_attention_flops():
    assert attention_flops(2, 8, 128, 256, 64) == 4 * 2 * 8 * 128 * 256 * 64
    assert attention_flops(2, 8, 128, 256, 64, causal=True) == 2 * 2 * 8 * 128 * 256 * 64


def test_limit_threads_restores_both_pools():
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before_torch, before_blas = torch.get_num_threads(), blas_threads()
    with limit_threads(1, torch=True):
        assert torch.get_num_threads() == 1
        assert all(n == 1 for n in blas_threads())
    assert torch.get_num_threads() == before_torch and blas_threads() == before_blas
    with pytest.raises(RuntimeError, match="boom"), limit_threads(1, torch=True):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before_torch and blas_threads() == before_blas
    with pytest.raises(AttnlabError, match="threads: expected an integer >= 1"):
        with limit_threads(0):
            pass
    with limit_threads(None, torch=True):  # None: nothing changes
        assert torch.get_num_threads() == before_torch and blas_threads() == before_blas


def test_tracemalloc_probe_sees_numpy_buffers():
    n_bytes = 8 * 2**20
    peak = peak_traced_bytes(lambda: np.ones(n_bytes // 8))
    assert n_bytes <= peak < n_bytes + 2**16
    # a temporary freed inside the call still counts: that is what "peak" means
    assert peak_traced_bytes(lambda: float(np.ones(n_bytes // 8).sum())) >= n_bytes


def test_rss_probe_sees_torch_buffers():
    n_bytes = 64 * 2**20
    peak = peak_rss_bytes(lambda: torch.ones(n_bytes // 4))
    if peak is None:
        pytest.skip("no /proc/self/clear_refs on this platform")
    assert 0.9 * n_bytes <= peak < 1.3 * n_bytes


def test_timing_and_config_validation():
    t = Timing([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (t.median, t.min, t.max) == (3.0, 1.0, 5.0)
    assert t.to_dict()["samples_s"] == [3.0, 1.0, 2.0, 5.0, 4.0]
    with pytest.raises(AttnlabError, match="contenders: expected names from"):
        BenchConfig(contenders=("numpy_naive", "jax"))
    with pytest.raises(AttnlabError, match="lengths: expected at least one"):
        BenchConfig(lengths=())
    with pytest.raises(AttnlabError, match="repeats: expected an integer >= 1"):
        BenchConfig(repeats=0)
    with pytest.raises(AttnlabError, match="model: expected a DecoderConfig"):
        BenchConfig(model="tiny")  # type: ignore[arg-type]
    quick = BenchConfig.quick(model=DecoderConfig(d_model=32))
    assert quick.model.d_model == 32 and quick.repeats == 5


def test_out_that_cannot_be_a_folder_fails_before_measuring(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    for out, message in ((str(tmp_path / "file"), "--out: expected a folder, got"),
                         (str(tmp_path / "file" / "sub"), "--out: could not create the folder"),
                         ("", "--out: expected a folder, got an empty string")):
        code, stdout, err = run_cli(capsys, *TINY, "--no-progress", "--out", out)
        assert code == 2 and stdout == ""  # no table: nothing was measured first
        assert message in err and err.count("\n") == 1


def test_a_huge_min_time_caps_the_loop_instead_of_overflowing():
    """min_time / (one call's seconds) = inf: math.ceil(inf) was an OverflowError (exit 1)."""
    assert calls_per_sample(lambda: None, 1e308) == 10_000


def test_interleaved_rotates_the_order_and_takes_medians():
    order: list[str] = []
    rounds: list[int] = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    timings = interleaved(calls, 3, after_round=rounds.append)
    assert order == list("abc" "bca" "cab") and rounds == [0, 1, 2]
    assert set(timings) == set("abc")
    assert all(len(t.samples) == 3 and t.calls_per_sample == 1 for t in timings.values())
    # min_time 0: a stateful call runs exactly once per sample, never to calibrate.
    assert calls_per_sample(lambda: order.append("x"), 0.0) == 1 and "x" not in order
