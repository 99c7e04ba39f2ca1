"""`attnlab draw` and attnlab.report.draw: every concept drawn, in both languages."""

from __future__ import annotations

import pytest
from tests.support.language import english_runs

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.report import draw
from attnlab.report.concepts import CONCEPTS


def test_every_concept_draws_from_the_cli_in_chinese(tmp_path, capsys):
    assert main(["draw", "all", "--lang", "zh", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in CONCEPTS:
        path = tmp_path / f"{name}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"已写入 {path}" in out


def test_english_figures_are_in_english():
    from matplotlib.text import Text

    texts = [t.get_text() for t in draw("flash", lang="en").findobj(Text) if t.get_text()]
    assert english_runs("\n".join(texts))  # the Chinese test's detector sees English here


def test_unknown_concept_is_one_line(capsys):
    assert main(["draw", "tiles"]) == 2
    assert "invalid choice: 'tiles'" in capsys.readouterr().err
    with pytest.raises(AttnlabError, match="name: expected one of"):
        draw("tiles")
