"""explain's trace drawn and written to files (needs matplotlib, so not in tests/core)."""

from __future__ import annotations

import json

from attnlab import explain
from attnlab.report import plot, save


def test_save_writes_all_outputs(tmp_path):
    written = save(explain(tokens=["小明", "去了", "学校"]), tmp_path / "out", lang="zh")
    names = sorted(p.name for p in written)
    assert names == ["heatmap.png", "heatmap.svg", "trace.json", "trace.md"]
    assert (tmp_path / "out" / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "注意力计算过程" in (tmp_path / "out" / "trace.md").read_text(encoding="utf-8")
    saved = json.loads((tmp_path / "out" / "trace.json").read_text(encoding="utf-8"))
    assert saved["steps"][0]["title"] == {"en": "Input X", "zh": "输入 X"}


def test_single_head_heatmap_has_seed000_title():
    figure = plot(explain(), lang="zh")
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == "注意力分数 Q·Kᵀ" and "注意力权重热图" in titles
