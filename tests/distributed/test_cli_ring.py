"""``attnlab ring`` on real gloo processes: the table it prints, and its error check."""

from __future__ import annotations

import re

from attnlab.cli.app import main


def test_cli_runs_processes(capsys):
    code = main(["ring", "--world-size", "2", "--seq", "64", "--heads", "4", "--kv-heads",
                 "2", "--head-dim", "8", "--causal", "--backward", "--repeats", "1",
                 "--timeout", "240"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "W = 2 gloo processes · zigzag · causal" in out
    assert len(re.findall(r"^\s+[01]\s+[\d.]+ MiB", out, flags=re.M)) == 2
    error = float(re.search(r"max error against single-process attention: (\S+)", out)[1])
    # float32 ring vs float32 single-process attention: PyTorch CP's atol 2e-6
    assert error < 2e-6


def test_out_without_simulate_is_refused(capsys, tmp_path):
    # --out only has a meaning with --simulate; without it the folder was silently ignored.
    folder = tmp_path / "ring"
    for lang, line in (("en", "error: --out: writes the simulation's figure, so it needs "
                              "--simulate"),
                       ("zh", "错误：--out：写出的是模拟的图，需要同时给出 --simulate")):
        code = main(["--lang", lang, "ring", "--world-size", "2", "--seq", "8",
                     "--out", str(folder)])
        out, err = capsys.readouterr()
        assert code == 2 and out == ""
        assert err.strip().splitlines() == [line]
    assert not folder.exists()
