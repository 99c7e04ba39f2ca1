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


def figure_text(fig):
    from matplotlib.text import Text

    return "\n".join(t.get_text() for t in fig.findobj(Text) if t.get_text())


@pytest.mark.parametrize("name", sorted(CONCEPTS))
def test_each_figure_is_in_its_language(name):
    zh, en = figure_text(draw(name, lang="zh")), figure_text(draw(name, lang="en"))
    assert english_runs(zh) == []
    assert english_runs(en)  # the detector does find the English version's sentences


def test_unknown_concept_is_one_line(capsys):
    assert main(["draw", "tiles"]) == 2
    assert "invalid choice: 'tiles'" in capsys.readouterr().err
    with pytest.raises(AttnlabError, match="name: expected one of"):
        draw("tiles")
