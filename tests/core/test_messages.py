"""The keyed message catalog: every key has both languages with the same fields, every
key the source names exists, and a message renders in the language asked for."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

import attnlab
from attnlab.checks import check_finite
from attnlab.errors import AttnlabError, missing_extra
from attnlab.messages import LANGS, MESSAGES, Message, msg, render, render_error

SOURCE = Path(attnlab.__file__).parent
_CJK = re.compile(r"[\u4e00-\u9fff]")


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


@pytest.mark.parametrize("key", sorted(MESSAGES))
def test_every_key_has_both_languages_with_the_same_fields(key):
    templates = MESSAGES[key]
    assert len(templates) == len(LANGS) == 2
    english, chinese = templates
    assert english.strip() and chinese.strip()
    assert not _CJK.search(english), english
    assert _fields(english) == _fields(chinese), key
    # A Chinese sentence wherever the English has words of its own (not only fields).
    if re.search(r"[A-Za-z]{3,}", re.sub(r"\{\w*\}", "", english)):
        assert _CJK.search(chinese), chinese


def test_every_key_named_in_the_source_exists():
    used = set()
    for path in SOURCE.rglob("*.py"):
        used |= set(re.findall(r'\bmsg\(\s*"([\w.]+)"', path.read_text(encoding="utf-8")))
    missing = sorted(k for k in used if k not in MESSAGES)
    assert used and not missing, missing


def test_a_message_renders_in_each_language_with_nested_phrases():
    m = msg("check.expected_got", name="rng", what=msg("phrase.seed"), got=-1)
    assert m.render("en") == "rng: expected an int seed >= 0, got -1"
    assert m.render("zh") == "rng：需要≥ 0 的整数种子，实际得到 -1"
    assert str(m) == m.render("en")
    assert render("phrase.error", "zh", text="x") == "错误：x"
    with pytest.raises(KeyError, match="no message"):
        msg("no.such.key")


def test_errors_carry_their_message():
    import numpy as np

    with pytest.raises(AttnlabError) as info:
        check_finite(np.array([1.0, np.nan]), "q")
    assert str(info.value) == ("q: expected finite values, got 1 non-finite "
                               "(first: NaN at index (1,))")
    assert isinstance(info.value.message, Message)
    assert render_error(info.value, "zh") == ("q：需要有限值，实际有 1 个非有限值"
                                              "（第一个：位置 (1,) 上的 NaN）")
    plain = AttnlabError("a plain message")
    assert plain.message is None and render_error(plain, "zh") == "a plain message"
    extra = missing_extra("torch", "torch", "attnlab.torch ")
    assert "pip install 'attnlab[torch]'" in render_error(extra, "zh")


def test_a_message_travels_as_data_and_lists_join_per_language():
    from attnlab.messages import Listing, render_value

    m = msg("approx.says.faster_from", wins=Listing([msg("approx.says.win", knob="W", value=8,
                                                         T=64), "x"], comma=True))
    assert m.render("en") == ("On the Gaussian inputs, faster than exact at every T "
                              "measured from: W=8 from T=64, x.")
    assert "W=8 从 T=64 起，x" in m.render("zh")
    note = msg("profile.note.tiled", rows=512)
    data = note.as_dict()
    assert data == {"key": "profile.note.tiled", "params": {"rows": 512}}
    assert render_value(data, "zh") == note.render("zh") and render_value("plain", "zh") == "plain"


def test_the_areas_join_the_catalog():
    from attnlab.messages.exercises import EXERCISE_MESSAGES
    from attnlab.messages.studies import STUDY_MESSAGES

    assert set(STUDY_MESSAGES) <= set(MESSAGES) and set(EXERCISE_MESSAGES) <= set(MESSAGES)


def test_the_shared_shape_checks_are_keyed():
    """Both twins raise the shape errors of attnlab.shapes: keyed, so they render in Chinese."""
    from attnlab.errors import ShapeError
    from attnlab.shapes import check_attention_shapes, check_module_inputs

    with pytest.raises(ShapeError) as info:
        check_attention_shapes((2, 3, 4), (2, 5, 4), (2, 6, 4))
    assert str(info.value) == "v: expected (..., 5, Dv) to match k's length S = 5, got (2, 6, 4)"
    assert info.value.message.render("zh") == (
        "v：需要 (..., 5, Dv)，与 k 的长度 S = 5 一致，实际形状为 (2, 6, 4)")
    with pytest.raises(ShapeError) as info:
        check_module_inputs((2, 3, 8), (2, 5, 8), (2, 4, 8), 8, 8)
    assert str(info.value) == "value: expected (2, 5, 8) to match key's length, got (2, 4, 8)"
    assert "与 key 的长度一致" in info.value.message.render("zh")
