"""Find English left in Chinese output: a run of three or more English words that are
not names (Q, K, V, softmax, LayerNorm, a file name, a flag, a number, ...)."""

from __future__ import annotations

import re

#: Names that stay as they are in Chinese text: symbols, methods, libraries, units,
#: command-line flags and their values.
NAMES = {
    "q", "k", "v", "x", "wq", "wk", "wv", "wo", "softmax", "layernorm", "flash", "attention",
    "kv", "rope", "alibi", "bigbird", "linformer", "nyström", "nystrom", "performer",
    "query", "key", "value", "token", "tokens", "pre-ln", "post-ln", "gelu", "js", "cls",
    "sep", "pad", "unk", "mha", "gqa", "sdpa", "torch", "pytorch", "numpy", "blas", "openblas",
    "minilm", "all-minilm-l6-v2", "bert", "json", "png", "svg", "csv", "npy", "html", "md",
    "cpu", "gpu", "ms", "mib", "gib", "kib", "mb", "gb", "attnlab", "seed", "d_k", "d_model",
    "head_dim", "threadpoolctl", "matplotlib", "safetensors", "tokenizers", "transformers",
    "sentence-transformers", "hugging", "face", "float32", "float64", "bfloat16", "fp32",
    "sinusoidal", "learned", "none", "pre", "post", "seed000", "seed001", "en", "zh", "text",
    "markdown", "normal", "xavier", "xavier_normal", "flops", "dropout", "ffn", "python",
    "mean", "max", "lse", "exp", "log", "sum", "relu", "the", "cat", "sat", "on", "mat",
    "it", "animal", "street", "didn't", "cross", "because", "was", "too", "tired",
    "exact", "window", "global", "block", "low-rank", "sparse",
    # the variables of explain's formulas (masked = where(allowed, scaled, -∞))
    "masked", "scaled", "scores", "weights", "output", "where", "allowed", "concat",
    "projected", "residual", "normed", "var", "view", "transpose", "contiguous", "all",
    # the values of lens's, train's, ring's and inspect's options
    "zero", "scaling", "norm", "positions", "sort", "reverse", "copy", "induction", "modadd",
    "zigzag", "striped", "table",
}
_WORD = re.compile(r"[A-Za-z][A-Za-z'_\-]*")


def _is_name(token: str) -> bool:
    """A name, not a word: listed, an identifier (digits, underscores, hyphens), a
    metavariable or acronym in capitals (DIR, MATRIX, FFN), or one letter."""
    return (token.lower() in NAMES or len(token) == 1 or token.isupper()
            or any(c.isdigit() or c in "_-" for c in token))


def english_runs(text: str, *, min_words: int = 3) -> list[str]:
    """Runs of at least ``min_words`` English words (none of them a name) in a row,
    separated only by spaces or ASCII punctuation."""
    found = []
    for line in text.splitlines():
        # Split into stretches of ASCII text; CJK characters end a stretch.
        for stretch in re.split(r"[^\x00-\x7f]+", line):
            run: list[str] = []
            for token in re.split(r"[\s,.;:!?()\[\]{}\"`/|=<>+*#]+", stretch):
                if _WORD.fullmatch(token) and not _is_name(token):
                    run.append(token)
                    continue
                if len(run) >= min_words:
                    found.append(" ".join(run))
                run = []
            if len(run) >= min_words:
                found.append(" ".join(run))
    return found
