"""attnlab train: the files it writes hold what they say, Chinese output, one-line errors;
the training page is self-contained and shows hostile labels as text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlab.cli.app import main
from attnlab.report.training import plot_training, training_html
from attnlab.studies.training import plan, study_table

TINY = ["--steps", "3", "--d-model", "16", "--heads", "2", "--layers", "1"]


def test_train_writes_every_output(capsys, tmp_path):
    code = main(["train", "induction", *TINY, "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    for name in ("metrics.json", "attention.npz", "training.png", "view.html"):
        assert (tmp_path / name).stat().st_size > 0 and name in err
    assert "training [" in err and "3/3" in err  # the progress bar, on stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    for key in ("task", "steps", "seed", "seconds", "final_loss", "head_scores", "history",
                "first_half_loss", "second_half_loss"):
        assert key in metrics
    assert metrics["task"] == "induction" and metrics["steps"] == 3
    assert metrics["model"]["attn_only"] is True and metrics["model"]["pos"] == "rope"
    assert np.array(metrics["head_scores"]["induction"]).shape == (1, 2)
    saved = np.load(tmp_path / "attention.npz")
    assert saved["weights"].shape == (1, 2, 32, 32) and saved["weights"].dtype == np.float32
    assert int(saved["period"]) == 16 and saved["tokens"].shape == (32,)
    np.testing.assert_allclose(saved["weights"].sum(-1), 1.0, atol=1e-5)  # float32 rows
    assert "held-out loss: first copy" in out and "best induction head" in out
    ablation = metrics["ablation"]
    assert ablation["previous_token_head"][0] == 0 and len(ablation["per_head"]["zero"]) == 1
    assert len(ablation["induction_heads"]) + len(ablation["other_heads"]) == 1  # of 2 heads
    assert all(x > 0 for x in ablation["per_head"]["mean"][0])
    assert "ablation (held-out loss on the repeat" in out


def test_train_sort_reports_heldout_accuracy_in_chinese(capsys, tmp_path):
    code = main(["train", "sort", *TINY, "--lang", "zh", "--no-scale", "--norm", "post",
                 "--pos", "sinusoidal", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "留出集完全正确率" in out and "已写入" in err
    metrics = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert 0 <= metrics["heldout_accuracy"] <= 1 and metrics["heldout_examples"] == 5000
    assert metrics["model"]["scale"] is False and metrics["model"]["norm"] == "post"
    assert "heldout_accuracy" in metrics and "period" not in metrics


@pytest.mark.parametrize("args, message", [
    (["train"], "expected a TASK"),
    (["train", "sort", "--study", "norm"], "not both"),
    (["train", "sort", "--steps", "0"], "--steps: expected a positive integer, got 0"),
    (["train", "parity"], "invalid choice"),
    (["train", "sort", "--d-model", "30", "--heads", "4"], "d_model: expected a multiple"),
])
def test_train_errors_are_one_line(capsys, tmp_path, args, message):
    code = main([*args, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_training_page_is_self_contained_and_escapes_labels():
    hostile = ["</script><script>alert(1)</script>", "<img src=x onerror=alert(1)>"]
    w = np.full((3, 1, 1, 2, 2), 0.5)
    page = training_html(w, [0, 5, 10], hostile, title="<b>t</b>",
                         head_history={"induction": np.zeros((3, 1, 1))},
                         heldout_loss=[1.0, float("nan"), 0.5])
    assert "<img" not in page and "alert(1)</script>" not in page and "<b>t" not in page
    assert "http://" not in page and "https://" not in page and "default-src 'none'" in page
    start = page.index('id="training-data">') + len('id="training-data">')
    data = json.loads(page[start:page.index("</script>", start)])
    assert data["tokens"] == hostile and data["steps"] == [0, 5, 10]
    assert data["weights"][0][0][0] == [[500, 500], [500, 500]]  # thousandths
    assert data["heldout_loss"] == [1.0, None, 0.5]


def test_training_page_and_plot_refuse_bad_shapes():
    from attnlab.errors import ShapeError

    with pytest.raises(ShapeError, match="snapshots: expected"):
        training_html(np.ones((1, 2, 2)), [0], ["a", "b"])
    with pytest.raises(ShapeError, match="snapshot_steps: expected K = 2"):
        training_html(np.full((2, 1, 1, 2, 2), 0.5), [0], ["a", "b"])
    with pytest.raises(ShapeError, match=r"head_history\['induction'\]"):
        plot_training([1.0, 0.5], [0, 2], {"induction": np.zeros((3, 1, 1))})


def test_study_plan_and_table():
    assert len(plan("scaling")) == 6 and len(plan("norm")) == 12 and len(plan("positions")) == 4
    runs = [{"num_layers": 2, "norm": "post", "warmup": 0, "failed": failed,
             "final_loss": loss} for failed, loss in ((True, 2.0), (False, 0.5))]
    table = study_table({"study": "norm", "seeds": 2, "seconds": 1.0, "runs": runs})
    assert "| 2 | post-LN | 0 | 1/2 | 1.250 |" in table
    zh = study_table({"study": "norm", "seeds": 2, "seconds": 1.0, "runs": runs}, "zh")
    assert "失败的种子" in zh


def test_training_page_assets_are_package_data_files():
    import fnmatch
    from importlib import resources
    from pathlib import Path

    import tomllib

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["package-data"]["attnlab"]
    assets = resources.files("attnlab.report").joinpath("assets")
    names = sorted(e.name for e in assets.iterdir() if e.name.startswith("training."))
    assert names == ["training.css", "training.html", "training.js"]
    for name in names:
        assert any(fnmatch.fnmatch(f"report/assets/{name}", glob) for glob in globs), name
    page = training_html(np.full((1, 1, 1, 2, 2), 0.5), [0], ["a", "b"])
    assert assets.joinpath("training.js").read_text(encoding="utf-8").strip() in page


@pytest.mark.parametrize("lang, words", [("en", "training diverged at step"),
                                         ("zh", "发散")])
def test_a_diverging_run_says_so_in_one_line_and_keeps_its_metrics(capsys, tmp_path, lang,
                                                                   words):
    code = main(["train", "sort", *TINY, "--steps", "8", "--lr", "1e30", "--lang", lang,
                 "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    last = err.strip().splitlines()[-1]
    assert code == 2 and words in last and "metrics.json" in last, err
    assert "weights: expected finite" not in err and "期望" not in err
    metrics = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["diverged_at"] is not None and metrics["last_finite_loss"] is not None
    assert f"step {metrics['diverged_at']}" in last or f"第 {metrics['diverged_at']} 步" in last
    assert not (tmp_path / "view.html").exists()  # no plots of a broken run


def test_train_without_torch_names_the_extra_to_install(capsys, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    code = main(["train", "sort", *TINY, "--out", str(tmp_path)])
    _, err = capsys.readouterr()
    assert code == 2 and "pip install 'attnlab[torch]'" in err, err
    assert "No module named" not in err and len(err.strip().splitlines()) == 1
