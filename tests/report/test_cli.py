"""The attnlab command line: default run, options, outputs, one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import attnlab
from attnlab.cli.app import main


def run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_default_prints_seed000_example(capsys):
    code, out, err = run(capsys, "explain")
    assert code == 0 and err == ""
    assert "Step 1 · Input X" in out and "Step 11 · Output" in out
    # The printed weights are the library's numbers for seed 0 (4 decimals).
    weights = attnlab.explain(seed=0).get("weights").values
    assert f"{weights[0, 0]:.4f}" in out


def test_chinese_tokens_heads_causal(capsys, tmp_path):
    code, out, err = run(capsys, "explain", "--tokens", "小明 去了 学校", "--heads", "2",
                         "--causal", "--lang", "zh", "--out", str(tmp_path))
    assert code == 0
    assert "第 1 个头" in out and "掩码后的分数" in out and "小明" in out
    for name in ("heatmap.png", "heatmap.svg", "trace.json", "trace.md"):
        assert (tmp_path / name).stat().st_size > 0
        assert name in err  # what was written is reported
    data = json.loads((tmp_path / "trace.json").read_text(encoding="utf-8"))
    assert data["tokens"] == ["小明", "去了", "学校"] and data["meta"]["num_heads"] == 2


def test_formats(capsys):
    code, out, _ = run(capsys, "explain", "--format", "json")
    assert code == 0 and json.loads(out)["meta"]["d_k"] == 3
    code, out, _ = run(capsys, "explain", "--format", "markdown", "--lang", "zh")
    assert code == 0 and out.startswith("# 注意力计算过程")


def test_x_inline_json_npy_csv(capsys, tmp_path):
    X = np.array([[1.0, 2.0], [3.0, 4.0], [0.5, -1.0]])
    np.save(tmp_path / "x.npy", X)
    np.savetxt(tmp_path / "x.csv", X, delimiter=",")
    outputs = []
    for spec in ("1,2; 3,4; 0.5,-1", "[[1,2],[3,4],[0.5,-1]]", str(tmp_path / "x.npy"),
                 str(tmp_path / "x.csv")):
        code, out, err = run(capsys, "explain", "--x", spec, "--d-k", "2", "--format", "json")
        assert code == 0, err
        outputs.append(json.loads(out)["steps"][-1]["values"])
    assert all(o == outputs[0] for o in outputs)


@pytest.mark.parametrize(
    "args,message",
    [
        (["explain", "--x", "1,2; 3"], "--x: expected a matrix like"),
        (["explain", "--x", "missing.npy"], "--x: file not found: missing.npy"),
        (["explain", "--tokens", "a b", "--x", "1,2; 3,4; 5,6"],
         "tokens: expected 3 labels to match X's rows, got 2"),
        (["explain", "--d-k", "0"], "d_k: expected an integer >= 1, got 0"),
        (["explain", "--heads", "x"], "argument --heads: invalid int value: 'x'"),
        (["explain", "--lang", "fr"], "argument --lang: invalid choice: 'fr'"),
        (["explain", "--x", "1,nan; 2,3"], "X: expected finite values"),
        (["explain", "--tokens", "   "], "--tokens: expected at least one token"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_installed_entry_point_runs_without_traceback(tmp_path):
    exe = shutil.which("attnlab", path=os.path.dirname(sys.executable))
    if exe is None:  # not installed as a script (e.g. run from a source tree)
        cmd = [sys.executable, "-m", "attnlab"]
    else:
        cmd = [exe]
    ok = subprocess.run([*cmd, "explain", "--lang", "zh"], capture_output=True, text=True,
                        timeout=120, env={**os.environ, "PYTHONPATH": "src"})
    assert ok.returncode == 0 and "第 1 步" in ok.stdout
    bad = subprocess.run([*cmd, "explain", "--x", "oops"], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": "src"})
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "--x:" in bad.stderr


def test_core_imports_numpy_only():
    """The core is NumPy only: torch, matplotlib and the model libraries load lazily."""
    code = ("import sys, attnlab, attnlab.cli.app; "
            "heavy = [m for m in ('torch', 'matplotlib', 'safetensors', 'tokenizers', "
            "'transformers') if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": "src"})
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_missing_extra_message_names_the_extra(monkeypatch):
    """Without matplotlib, plotting says which extra to install."""
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    from attnlab.report import heatmaps as viz

    with pytest.raises(ImportError, match=r"pip install 'attnlab\[viz\]'"):
        viz.plot_attention(np.eye(2))


# ------------------------------------------------- adversarial command lines


@pytest.mark.parametrize(
    "args,message",
    [
        # Sizes whose printout never ends (or whose weights do not fit in memory).
        (["explain", "--d-k", "100000000"], "would print 2,400,000,039 numbers, more than"),
        (["explain", "--heads", "100000000"], "explain prints every matrix"),
        (["explain", "--tokens", "a b", "--d-model", "100000000000"],
         "explain prints every matrix"),
        # --d-model is silently ignored unless it is used.
        (["explain", "--d-model", "0"], "--d-model: only used with --tokens and no --x"),
        (["explain", "--x", "1,2; 3,4", "--d-model", "8"], "--d-model: only used with"),
        # JSON that is not a matrix of numbers was converted (true -> 1.0, "2" -> 2.0).
        (["explain", "--x", "[[true, false], [1, 0]]"], "--x: expected a matrix like"),
        (["explain", "--x", '[["1", "2"]]'], "--x: expected a matrix like"),
        # --out that cannot be a folder.
        (["explain", "--out", ""], "--out: expected a folder, got an empty string"),
        (["explain", "--out", "/proc/attnlab-test"], "--out: could not create the folder"),
    ],
)
def test_adversarial_explain_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_bad_x_files_and_out_paths_are_one_line(capsys, tmp_path):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "empty.npy").write_bytes(b"")
    (tmp_path / "text.npy").write_text("not an array")
    (tmp_path / "file").write_text("")
    np.save(tmp_path / "huge.npy", np.full((2, 4), 1e300))
    cases = [
        (["--x", str(tmp_path / "empty.csv")], "empty.csv holds no numbers"),  # + a warning
        (["--x", str(tmp_path / "empty.npy")], "is not a .npy file"),  # was EOFError
        (["--x", str(tmp_path / "text.npy")], "is not a .npy file"),  # was "pickled data"
        (["--x", str(tmp_path / "huge.npy")], "q, k: the scaled scores could reach"),  # NaN
        (["--out", str(tmp_path / "file")], "--out: expected a folder, got"),
        (["--out", str(tmp_path / "file" / "sub")], "--out: could not create the folder"),
    ]
    for args, message in cases:
        code, out, err = run(capsys, "explain", *args)
        assert code == 2 and message in err and err.count("\n") == 1, (args, err)


def test_memory_error_is_a_one_line_usage_error(capsys, monkeypatch):
    def too_big(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.28 TiB for an array")

    monkeypatch.setattr(sys.modules["attnlab.lens.explain"], "explain", too_big)
    code, out, err = run(capsys, "explain")
    assert code == 2 and err == ("error: not enough memory: Unable to allocate 7.28 TiB for an "
                                 "array; use smaller sizes\n")


@pytest.mark.parametrize("command, option", [
    (["bench", "--quick", "--no-progress"], "--lengths"),
    (["bench", "--quick", "--no-progress"], "--contexts"),
    (["profile", "--quick"], "--seq-lens"),
    (["approx", "--quick", "--no-minilm"], "--lengths"),
    (["approx", "--quick"], "--minilm-lengths"),
])
@pytest.mark.parametrize("value, expected", [
    ("16,x", "expected comma-separated integers like"),
    ("0,16", "expected positive integers like"),
    ("", "expected positive integers like"),
])
def test_every_integer_list_option_has_one_parser(capsys, command, option, value, expected):
    """One parser (cli.args.int_list) for every T,T,... option: the same one-line errors."""
    code = main([*command, option, value])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith(f"error: {option}: {expected}")
    assert captured.err.count("\n") == 1


def test_integer_lists_take_commas_and_spaces():
    from attnlab.cli.args import int_list

    assert int_list("16, 40", "--lengths") == int_list("16 40", "--lengths") == (16, 40)
    assert int_list("8,,16,", "--lengths") == (8, 16)
