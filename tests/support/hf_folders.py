"""Small random Hugging Face folders (a decoder with grouped heads, GPT-2, BERT) that
``transformers`` loads like any downloaded model, with MiniLM's tokenizer files.

Built from transformers' config classes with a fixed seed, saved with
``save_pretrained`` (config.json, model.safetensors, tokenizer files): nothing is
downloaded. Small enough (width 32, 2 layers) that a forward at T = 64 takes
milliseconds.
"""

from __future__ import annotations

from pathlib import Path


def _tokenizer():  # MiniLM's WordPiece tokenizer (30,522 pieces), from the package
    from transformers import AutoTokenizer

    from attnlab.models.loading import minilm_path

    return AutoTokenizer.from_pretrained(str(minilm_path()))


def llama_folder(folder: Path, *, seed: int = 0, extra_tokens: list[str] | None = None) -> Path:
    """A random Llama: 2 layers, 4 query heads sharing 2 key/value heads (GQA), RoPE.
    ``extra_tokens`` join the vocabulary whole (hostile token texts, for the page)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tokenizer()
    if extra_tokens:
        tokenizer.add_tokens(extra_tokens)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         eos_token_id=None)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def gpt2_folder(folder: Path, *, seed: int = 0) -> Path:
    """A random GPT-2: 2 layers, 4 heads, learned positions, Conv1D projections."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=tokenizer.vocab_size, n_embd=32, n_layer=2, n_head=4,
                        n_positions=2048, pad_token_id=tokenizer.pad_token_id,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
