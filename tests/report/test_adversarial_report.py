"""Inputs chosen to break the views, the files and the CLI: each gives the right result or
one clear AttnlabError (the CLI: one line on stderr, exit 2).

The report-layer half of tests/core/test_adversarial.py, whose docstring says how
the errors are matched. Every test here failed before its fix with a bare exception
(UnicodeEncodeError, ...) or a CLI "internal error".
"""

from __future__ import annotations

import numpy as np
import pytest

import attnlab
from attnlab import report
from attnlab.errors import AttnlabError

# ---------------------------------------------------------------- G. traces, views, files


def test_attention_view_reads_a_generator_of_tokens_once():
    from attnlab.report.viewer import AttentionView

    weights = np.full((1, 2, 3, 3), 1 / 3)
    view = AttentionView(weights, (t for t in ["a", "b", "c"]),
                         key_tokens=(t for t in ["x", "y", "z"]))
    assert '"tokens":["a","b","c"]' in view.html and '"key_tokens":["x","y","z"]' in view.html


LONE = r"expected text that can be written as UTF-8, got .* with the lone surrogate"


def test_a_lone_surrogate_token_is_named_before_anything_is_written(tmp_path):
    from attnlab.report.viewer import AttentionView

    trace = attnlab.explain()
    trace.tokens = ["a", "caf\udce9", "c"]  # what undecodable bytes become in a str
    with pytest.raises(AttnlabError, match=rf"^tokens\[1\]: {LONE} '\\udce9' at index 3"):
        report.save(trace, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(AttnlabError, match=rf"^tokens\[1\]: {LONE}"):
        attnlab.explain(tokens=["a", "caf\udce9"])
    with pytest.raises(AttnlabError, match=rf"^tokens\[0\]: {LONE}"):
        AttentionView(np.full((1, 1, 2, 2), 0.5), ["\ud800", "b"])
    with pytest.raises(AttnlabError, match=rf"^title: {LONE}"):
        AttentionView(np.full((1, 1, 2, 2), 0.5), ["a", "b"], title="\udcff")


def test_saving_under_a_regular_file_names_the_file(tmp_path):
    from attnlab.report.heatmaps import plot_attention, save_figure
    from attnlab.report.viewer import AttentionView

    (tmp_path / "file").write_text("")
    trace = attnlab.explain()
    with pytest.raises(AttnlabError, match=r"^out_dir: cannot create the folder .*file/sub'?: "
                                           r".*file'? is a file$"):
        report.save(trace, tmp_path / "file" / "sub")
    with pytest.raises(AttnlabError, match=r"^out_dir: expected a folder, got .*file'?, "
                                           r"which is a file$"):
        report.save(trace, tmp_path / "file")
    view = AttentionView(np.full((1, 1, 2, 2), 0.5), ["a", "b"])
    with pytest.raises(AttnlabError, match=r"^path: cannot create the folder .*: .* is a file$"):
        view.save(tmp_path / "file" / "sub" / "view.html")
    with pytest.raises(AttnlabError, match=r"^path: cannot write .* \(Is a directory\)$"):
        view.save(tmp_path)
    with pytest.raises(AttnlabError, match=r"^path: expected a folder, got .*file'?, which is"):
        save_figure(plot_attention(np.eye(2)), tmp_path / "file" / "a.png")


# ---------------------------------------------------------------- B. attnlab inspect --model DIR


def _model_dir(tmp_path, name, config_edit=None, files=None):
    """A copy of the packaged MiniLM's small files, its weights linked, then broken as asked."""
    import json
    import os
    import shutil

    from attnlab.models import minilm_path

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    source, folder = minilm_path(), tmp_path / name
    folder.mkdir()
    for small in ("config.json", "tokenizer.json", "sentence_bert_config.json"):
        shutil.copy(source / small, folder / small)
    try:
        (folder / "model.safetensors").symlink_to(source / "model.safetensors")
    except OSError:  # no symlinks on this file system
        shutil.copy(source / "model.safetensors", folder / "model.safetensors")
    if config_edit is not None:
        config = json.loads((source / "config.json").read_text(encoding="utf-8"))
        config.update(config_edit)
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for file_name, data in (files or {}).items():
        (folder / file_name).write_bytes(data)
    return folder


BROKEN_MODELS = [
    ({"files": {"config.json": b"5"}},
     "config.json: expected a JSON object of settings, got int 5"),
    ({"files": {"config.json": b'{"hidden_act": "caf\xe9"}'}}, "config.json: not valid UTF-8"),
    ({"config_edit": {"layer_norm_eps": "abc"}},
     "config.json: layer_norm_eps expected a finite number > 0, got 'abc'"),
    ({"config_edit": {"pad_token_id": "x"}},
     "config.json: pad_token_id expected an integer in 0..30521 (vocab_size), got 'x'"),
    ({"config_edit": {"num_hidden_layers": True}},
     "config.json: num_hidden_layers expected a positive integer, got True"),
    ({"config_edit": {"hidden_act": ["gelu"]}}, "config.json: hidden_act expected one of"),
    ({"files": {"tokenizer.json": b"{not json"}}, "tokenizer.json: could not be read ("),
    ({"files": {"sentence_bert_config.json": b"{not json"}},
     "sentence_bert_config.json: not valid JSON ("),
    ({"files": {"sentence_bert_config.json": b'{"max_seq_length": "abc"}'}},
     "sentence_bert_config.json: max_seq_length expected an integer in 1..512 "
     "(max_position_embeddings), got 'abc'"),
    ({"config_edit": {"num_hidden_layers": 30_000_000}},
     "config.json declares num_hidden_layers = 30000000, but the weights hold 6 layers"),
]


@pytest.mark.parametrize("broken,message", BROKEN_MODELS,
                         ids=[m.split(":")[0] + f"-{i}" for i, (_, m) in enumerate(BROKEN_MODELS)])
def test_inspect_names_what_is_wrong_in_a_model_folder(tmp_path, capsys, broken, message):
    import time

    from attnlab.cli.app import main

    folder = _model_dir(tmp_path, "model", **broken)
    start = time.perf_counter()
    code = main(["inspect", "hi", "--model", str(folder), "--out", str(tmp_path / "out")])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    # Sizes are checked against the weight file before anything is built: a config
    # declaring 30 million layers used to run for a minute and take all memory.
    assert elapsed < 20, elapsed


# ---------------------------------------------------------------- C. argv that is not UTF-8


def test_inspect_runs_text_that_is_not_utf8_replacing_the_bad_bytes(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable.encode(), b"-m", b"attnlab", b"inspect", b"caf\xe9 au lait",
         b"--layer", b"1", b"--head", b"1", b"--format", b"json", b"--out",
         str(tmp_path).encode()],
        capture_output=True, env=env, timeout=300,
    )
    err = done.stderr.decode("utf-8", "backslashreplace")
    assert done.returncode == 0, err
    assert "note: text: the argument is not valid UTF-8; its undecodable bytes were " \
           "replaced by \ufffd" in err
    assert "internal error" not in err
    assert (tmp_path / "view.html").stat().st_size > 0


def test_explain_takes_tokens_that_are_not_utf8(capsys):
    from attnlab.cli.app import main

    code = main(["explain", "--tokens", "caf\udce9 x"])  # sys.argv's form of b"caf\xe9 x"
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "caf\ufffd | x" in out
    assert "note: --tokens: the argument is not valid UTF-8" in err


# ---------------------------------------------------------------- H. --x fields are not skipped


@pytest.mark.parametrize("spec,message", [
    ("1,,2;3,4", "--x: row 1 of '1,,2;3,4' has an empty field ('1,,2')"),
    ("1,2,;3,4,5", "--x: row 1 of '1,2,;3,4,5' has an empty field ('1,2,')"),
    ("1,2;;3,4", "--x: row 2 of '1,2;;3,4' has an empty row ('')"),
    (";", "--x: row 1 of ';' has an empty row ('')"),
])
def test_explain_refuses_an_empty_field_in_x_instead_of_dropping_it(capsys, spec, message):
    from attnlab.cli.app import main

    code = main(["explain", "--x", spec])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err == f"error: {message}; expected numbers separated " \
                                              "by commas, rows by ';'\n"


@pytest.mark.parametrize("spec", ["1,0; 0,2", "1 0; 0 2", "1, 0 ;0 ,2", "1,0;0,2;"])
def test_explain_reads_the_inline_matrix_forms(capsys, spec):
    import json

    from attnlab.cli.app import main

    assert main(["explain", "--x", spec, "--format", "json"]) == 0
    trace = json.loads(capsys.readouterr().out)
    assert trace["steps"][0]["values"] == [[1.0, 0.0], [0.0, 2.0]]
