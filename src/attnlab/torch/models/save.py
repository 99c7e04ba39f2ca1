"""Back to the ecosystem: the trainable torch BERT saved as a Hugging Face folder.

:func:`save_pretrained` writes what ``transformers.AutoModel.from_pretrained`` and
``sentence_transformers.SentenceTransformer`` read, offline:

- ``config.json``: a ``BertModel`` config (``model_type: bert``) of the model's sizes;
- ``model.safetensors``: every weight under Hugging Face's BERT names
  (``embeddings.word_embeddings.weight``, ``encoder.layer.{l}.attention.self.query.weight``
  ...), and the pooler's weights when the model was loaded from a folder that had
  them (attnlab's encoder has no pooler: those tensors are carried over unchanged);
- ``tokenizer.json`` and ``tokenizer_config.json`` (BERT's special tokens);
- sentence-transformers' ``modules.json``, ``sentence_bert_config.json`` and
  ``1_Pooling/config.json`` (mean over real tokens) and ``2_Normalize``: the pipeline of
  :meth:`BertModel.encode`.

Loaded back, transformers' ``last_hidden_state`` and sentence-transformers' embeddings
equal the model's own (``forward`` and ``encode``) to float32 rounding
(tests/models/test_save_pretrained.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ...errors import AttnlabError, missing_extra

__all__ = ["save_pretrained", "hf_state_dict"]


def hf_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """The model's weights under Hugging Face's BERT names (contiguous CPU copies)."""
    from .bert import BertModel

    if not isinstance(model, BertModel):
        raise AttnlabError(f"model: expected an attnlab.torch BertModel, got "
                           f"{type(model).__name__}")
    tensors: dict[str, Any] = {
        "embeddings.word_embeddings.weight": model.word_embeddings.weight,
        "embeddings.position_embeddings.weight": model.position_embeddings.weight,
        "embeddings.token_type_embeddings.weight": model.token_type_embeddings.weight,
        "embeddings.LayerNorm.weight": model.embedding_norm.weight,
        "embeddings.LayerNorm.bias": model.embedding_norm.bias,
    }
    for index, block in enumerate(model.layers):
        layer: Any = block
        prefix = f"encoder.layer.{index}."
        attn = layer.self_attn
        pairs = {
            "attention.self.query": attn.q_proj, "attention.self.key": attn.k_proj,
            "attention.self.value": attn.v_proj, "attention.output.dense": attn.out_proj,
            "intermediate.dense": layer.ffn[0], "output.dense": layer.ffn[2],
            "attention.output.LayerNorm": layer.norm1, "output.LayerNorm": layer.norm2,
        }
        for name, module in pairs.items():
            tensors[prefix + name + ".weight"] = module.weight
            tensors[prefix + name + ".bias"] = module.bias
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def save_pretrained(model: Any, folder: str | Path, *,
                    pooler_from: str | Path | None = None) -> Path:
    """Write ``model`` (an :class:`attnlab.torch.models.BertModel`) as a Hugging Face and
    sentence-transformers folder (see the module docs); returns the folder.

    ``pooler_from``: a Hugging Face BERT folder whose ``pooler.dense`` weights are copied
    (e.g. the folder the model was loaded from); without it the saved model has no pooler
    and transformers initialises one (``pooler_output`` is then not meaningful; the
    hidden states and the sentence embeddings do not use it).
    """
    try:
        from safetensors.torch import load_file, save_file
    except ImportError:
        raise missing_extra("safetensors", "models", "Saving a model") from None
    tensors = hf_state_dict(model)
    if pooler_from is not None:
        source = load_file(str(Path(pooler_from) / "model.safetensors"))
        pooler = {k.removeprefix("bert."): v for k, v in source.items() if "pooler." in k}
        if not pooler:
            raise AttnlabError(f"pooler_from: expected a BERT folder with pooler weights, "
                               f"got {str(pooler_from)!r}, which has none")
        tensors.update(pooler)
    out = Path(folder)
    if out.exists() and not out.is_dir():
        raise AttnlabError(f"folder: expected a folder, got {str(folder)!r}, which is a file")
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    c = model.config
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads, "intermediate_size": c.intermediate_size,
        "max_position_embeddings": c.max_position_embeddings,
        "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.layer_norm_eps,
        "hidden_act": c.hidden_act, "pad_token_id": c.pad_token_id,
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02, "position_embedding_type": "absolute",
    }
    _write_json(out / "config.json", config)
    if model.tokenizer is not None:
        (out / "tokenizer.json").write_text(model.tokenizer.to_str(), encoding="utf-8")
        _write_json(out / "tokenizer_config.json", {
            "tokenizer_class": "BertTokenizer", "do_lower_case": True,
            "model_max_length": model.max_length, "cls_token": "[CLS]", "sep_token": "[SEP]",
            "pad_token": "[PAD]", "mask_token": "[MASK]", "unk_token": "[UNK]"})
    _write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}])
    _write_json(out / "sentence_bert_config.json",
                {"max_seq_length": model.max_length, "do_lower_case": False})
    (out / "1_Pooling").mkdir(exist_ok=True)
    _write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": c.hidden_size, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False})
    (out / "2_Normalize").mkdir(exist_ok=True)
    return out


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
