"""`attnlab draw` and attnlab.report.draw: every concept drawn, in both languages."""

from __future__ import annotations

import pytest
from tests.support.language import english_runs

from attnlab import AttnlabError
from attnlab.cli import main
from attnlab.report import draw
from attnlab.report.concepts import CONCEPTS
from attnlab.report.dataflow import draw_dataflow


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


def _texts(fig):
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_dataflow_writes_each_shape_with_its_numbers(lang):
    """T = 3 tokens, H = 2 heads, E = 8: D = Dv = 8 / 2 = 4, worked out by hand."""
    texts = _texts(draw_dataflow(lang, T=3, num_heads=2, d_model=8))
    expected = ["(T, E) = (3, 8)", "(H, T, D) = (2, 3, 4)", "(H, T, T) = (2, 3, 3)",
                "(H, T, Dv) = (2, 3, 4)", "(T, H·Dv) = (3, 8)"]
    for shape in expected:
        assert shape in texts, shape
    assert texts.count("(H, T, T) = (2, 3, 3)") == 2  # scores and weights
    # both residual arrangements, with the formula each one computes
    assert "LayerNorm(x + attention(x))" in texts and "x + attention(LayerNorm(x))" in texts
    joined = "\n".join(texts)
    if lang == "zh":
        assert "多头注意力" in joined and "前置规范化" in joined and "后置规范化" in joined
    else:
        assert english_runs(joined)
        assert "Pre-LN" in joined and "Post-LN" in joined


def test_dataflow_sizes_change_the_numbers_and_bad_sizes_are_named():
    texts = _texts(draw_dataflow("en", T=5, num_heads=4, d_model=16))  # D = 16 / 4 = 4
    assert "(H, T, D) = (4, 5, 4)" in texts and "(H, T, T) = (4, 5, 5)" in texts
    assert "(T, H·Dv) = (5, 16)" in texts
    with pytest.raises(AttnlabError, match="d_model: expected a multiple of num_heads = 3"):
        draw_dataflow("en", num_heads=3, d_model=8)
    with pytest.raises(AttnlabError, match="T"):
        draw_dataflow("en", T=0)


def test_dataflow_from_the_cli_takes_its_sizes(tmp_path, capsys):
    assert main(["draw", "dataflow", "--tokens", "小明 去了 学校 了", "--heads", "2",
                 "--d-model", "6", "--out", str(tmp_path)]) == 0
    path = tmp_path / "dataflow.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {path}" in capsys.readouterr().out
    assert main(["draw", "dataflow", "--heads", "4", "--d-model", "6",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "d_model: expected a multiple of num_heads = 4" in err and err.endswith("got 6\n")
    assert main(["draw", "flash", "--heads", "2", "--out", str(tmp_path)]) == 2
    assert "--heads: only used when drawing dataflow" in capsys.readouterr().err
