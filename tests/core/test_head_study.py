"""The head study's pieces that need no model: the shipped sentence pairs and Spearman's
rank correlation (against values worked out by hand)."""

from __future__ import annotations

import pytest

from attnlab.errors import AttnlabError
from attnlab.studies.heads import sentence_pairs, spearman


def test_shipped_pairs() -> None:
    english, chinese = sentence_pairs("en"), sentence_pairs("zh")
    assert len(english) + len(chinese) == len(sentence_pairs()) >= 50
    assert len(english) >= 25 and len(chinese) >= 25
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in a + b) for a, b in chinese)
    assert all(a.isascii() and b.isascii() for a, b in english)
    with pytest.raises(AttnlabError, match="lang: expected 'en', 'zh' or None"):
        sentence_pairs("fr")


def test_spearman_by_hand() -> None:
    # ranks (0, 1, 2, 3) against (1, 0, 3, 2): d = (1, 1, 1, 1), ρ = 1 − 6·4 / (4·15) = 0.6
    assert spearman([1.0, 2.0, 3.0, 4.0], [20.0, 10.0, 40.0, 30.0]) == pytest.approx(0.6,
                                                                                      abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0, abs=1e-12)
    # ties get mean ranks: (0.5, 0.5, 2) against (0, 1, 2): Pearson of those ranks = √3/2
    assert spearman([5, 5, 9], [1, 2, 3]) == pytest.approx(3 ** 0.5 / 2, abs=1e-12)


def test_the_readmes_importance_call_works_after_from_attnlab_import_lens() -> None:
    """The README writes ``lens.importance.head_importance(model, pairs)`` after
    ``from attnlab import lens``: a fresh interpreter, so no other test has imported
    the submodule first."""
    import subprocess
    import sys

    code = ("from attnlab import lens; "
            "assert callable(lens.importance.head_importance); "
            "assert lens.head_importance is lens.importance.head_importance")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
