"""`attnlab explain` as a lab from the command line, and its pictures: masked cells
hatched (never a plain 0.00), scores beside weights, numbers in multi-head plots, CJK
tick labels never turned, no tick labels on top of each other."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab import explain
from attnlab.cli import main
from attnlab.report import plot, plot_head_grid


def _run(capsys, *args):
    code = main(["explain", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_every_lab_flag_runs_and_shows_its_steps(capsys):
    code, out, err = _run(capsys, "--tokens", "the cat sat on the mat", "--pos", "rope",
                          "--padding", "1,1,1,1,1,0", "--norm", "post", "--heads", "2",
                          "--split", "fused", "--d-model", "8", "--causal")
    assert code == 0, err
    for needle in ("Q_all = X·Wq", "Queries after RoPE", "Masked scores", "Concatenated heads",
                   "Projected output", "Residual connection", "LayerNorm (post-LN)",
                   "== Notes =="):
        assert needle in out, needle
    code, out, _ = _run(capsys, "--no-scale", "--lang", "zh")
    assert code == 0 and "缩放已关闭" in out and "缩放后的分数" not in out
    code, out, _ = _run(capsys, "--tokens", "the cat sat on the mat")
    assert "Add positions (--pos sinusoidal)" in out
    code, out, _ = _run(capsys, "--tokens", "the cat sat on the mat", "--pos", "sinusoidal")
    assert "identical input rows" not in out and "Positional encoding pe" in out
    code, out, _ = _run(capsys, "--residual", "--norm", "pre", "--lang", "zh")
    assert code == 0 and "输入的层规范化（Pre-LN）" in out and "残差连接" in out


def test_saturated_input_is_noted(capsys):
    code, out, _ = _run(capsys, "--x", "100,0,100,0; 0,2,0,2; 1,1,1,1", "--seed", "3")
    assert code == 0
    assert "softmax is saturated" in out
    assert "Seed 000's softmax, exp(s) / sum(exp(s)) without subtracting the row max, gives " \
           "NaN" in out


@pytest.mark.parametrize("args, message", [
    (["--padding", "1,1"], "--padding: expected 3 values of 1 (a real token) or 0"),
    (["--padding", "1,2,1"], "--padding: expected 3 values"),
    (["--pos", "rope", "--d-k", "3"], "d_k: pos='rope' rotates pairs of features"),
    (["--split", "fused", "--heads", "3"], "split='fused' divides E = 4 into 3 heads"),
])
def test_lab_flag_errors_are_one_line(capsys, args, message):
    code, out, err = _run(capsys, *args)
    assert code == 2 and message in err and err.count("\n") == 1


def _blocked_cells_have_no_number(ax, allowed):
    texts = {(round(t.get_position()[1]), round(t.get_position()[0])) for t in ax.texts}
    blocked = {(int(r), int(c)) for r, c in zip(*np.nonzero(~allowed), strict=True)}
    hatched = [p for p in ax.patches if p.get_hatch() == "///"]
    return not (texts & blocked) and len(hatched) == len(blocked)


def test_masked_cells_are_hatched_not_zero_and_scores_sit_beside_weights():
    keep = np.array([True, True, True, False])
    trace = explain(tokens="小明 去了 学校 [PAD]".split(), num_heads=2, is_causal=True,
                    key_padding=keep)
    fig = plot(trace, lang="zh")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_title() for ax in panels][:3] == [
        "头 1 · 注意力分数 Q·Kᵀ", "头 1 · 缩放后的分数", "头 1 · 注意力权重"]
    allowed = np.tril(np.ones((4, 4), bool)) & keep
    for ax in panels:
        assert _blocked_cells_have_no_number(ax, allowed)
        assert len(ax.texts) == allowed.sum()  # every allowed cell keeps its number


def test_multi_head_grid_keeps_numbers_and_never_turns_cjk_labels():
    tokens = [f"词{i}" for i in range(8)]
    fig = plot_head_grid(np.full((2, 8, 8), 1 / 8), tokens, tokens, lang="zh")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert all(len(ax.texts) == 64 for ax in panels)
    for ax in panels:
        assert all(t.get_rotation() == 0 for t in ax.get_xticklabels())


@pytest.mark.parametrize("tokens", [
    [f"这是第{i}个很长的词元" for i in range(12)],
    [f"a_rather_long_token_{i}" for i in range(30)],
])
def test_tick_labels_never_overlap(tokens):
    T = len(tokens)
    fig = plot_head_grid(np.full((3, T, T), 1 / T), tokens, tokens, lang="zh")
    renderer = fig.canvas.get_renderer()
    for ax in (a for a in fig.axes if a.get_label() != "<colorbar>"):
        for ticks in (ax.get_xticklabels(), ax.get_yticklabels()):
            boxes = [t.get_window_extent(renderer) for t in ticks
                     if t.get_visible() and t.get_text()]
            for a, b in zip(boxes, boxes[1:], strict=False):
                assert not a.overlaps(b), (a, b)


def test_grad_diagnostics_is_reachable_from_the_package():
    import subprocess
    import sys

    code = "import attnlab; print(attnlab.grad_diagnostics.grad_norms.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "grad_norms"
