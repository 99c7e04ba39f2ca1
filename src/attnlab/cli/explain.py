"""``attnlab explain``: self-attention step by step (seed 000's example by default)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..lens.explain import FORMER_SPLITS, SPLITS
from ..messages import msg, render
from .args import CliError, parse_matrix, prepare_out_dir, text_argument

#: explain prints every matrix; past this many numbers the text is unreadable and
#: slow (500 tokens × 8 features is ~0.8 million numbers, ~4 s).
MAX_PRINTED = 2_000_000


def _split_name(value: str) -> str:
    """``--split``'s value; its former values ("seed000", "seed001", which read like a
    random seed beside ``--seed``) are still read, as the layouts they named."""
    return FORMER_SPLITS.get(value, value)


def add_parser(sub: Any) -> None:
    ex = sub.add_parser(
        "explain",
        help="print every step of self-attention (X → Q,K,V → QKᵀ → scale → softmax → ·V)",
        description="Run self-attention step by step. With no options: seed 000's example "
        "X = [[1,0,1,0],[0,2,0,2],[1,1,1,1]], d_k = 3, weights from --seed.",
    )
    ex.add_argument("--tokens", help='token labels, space separated, e.g. "小明 去了 学校"; '
                    "without --x each token gets a deterministic toy embedding")
    ex.add_argument("--x", metavar="MATRIX",
                    help="input X (T×E): inline '1,0,1,0; 0,2,0,2' or JSON, or a .npy/.csv file")
    ex.add_argument("--d-k", type=int,
                    help="head dim d_k (default 3; 4 with --pos rope; E / heads with "
                         "--split fused)")
    ex.add_argument("--d-model", type=int,
                    help="embedding width for --tokens without --x (default 4)")
    ex.add_argument("--heads", type=int, default=1, help="number of heads (default 1)")
    ex.add_argument("--causal", action="store_true", help="causal mask: no peeking ahead")
    ex.add_argument("--no-scale", action="store_true",
                    help="skip the ÷√d_k scaling, to see why the seeds scale")
    ex.add_argument("--pos", choices=["none", "sinusoidal", "learned", "rope"], default="none",
                    help="positional encoding: sinusoidal or learned (added to X), rope "
                         "(rotates Q and K); default none")
    ex.add_argument("--wo", action="store_true",
                    help="project the heads' output with Wo (seed 001's last linear layer)")
    ex.add_argument("--residual", action="store_true",
                    help="add the input back: x + attention(x) (implies --wo)")
    ex.add_argument("--norm", choices=["pre", "post"],
                    help="LayerNorm after the residual (post, seed 001's code) or before "
                         "attention (pre); implies --residual")
    ex.add_argument("--padding", metavar="1,1,0",
                    help="padding mask, one 1 (a real token) or 0 (padding) per token: "
                         "no token attends to padding")
    ex.add_argument("--split", type=_split_name, choices=SPLITS, default="per_head",
                    help="multi-head layout: per_head (seed 000: each head its own columns "
                         "of Wq) or fused (seed 001: one projection, then "
                         ".view(T, H, d_k).transpose); the same computation")
    ex.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    ex.add_argument("--init", choices=["normal", "xavier", "xavier_normal"], default="normal",
                    help="weight initialisation (default normal, as the seeds' randn)")
    ex.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the text")
    ex.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                    dest="fmt", help="what to print (default text)")
    ex.add_argument("--precision", type=int, default=4, help="decimals printed (default 4)")
    ex.add_argument("--out", metavar="DIR",
                    help="also write heatmap.png, heatmap.svg, trace.json, trace.md here")


def run(args: argparse.Namespace) -> int:
    from ..lens.explain import explain
    from ..report import save, to_json, to_markdown, to_text

    tokens = text_argument(args.tokens, "--tokens").split() if args.tokens is not None else None
    if tokens is not None and not tokens:
        raise CliError(msg("cli.tokens_empty"))
    X = parse_matrix(args.x) if args.x is not None else None
    if not 0 <= args.precision <= 12:
        raise CliError(msg("cli.precision", got=args.precision))
    if args.d_model is not None and (X is not None or tokens is None):
        raise CliError(msg("cli.d_model_with_x" if X is not None else "cli.d_model_no_tokens",
                           got=args.d_model))
    d_model = 4 if args.d_model is None else args.d_model
    if X is not None and X.ndim == 2:
        T, E = X.shape
    else:
        T, E = (3, 4) if tokens is None else (len(tokens), d_model)
    d_k = args.d_k
    if d_k is None and args.split == "per_head":
        d_k = 4 if args.pos == "rope" else 3
    key_padding = _padding(args.padding, T) if args.padding is not None else None
    _check_printable(T, E, args.heads, d_k or max(1, E // max(1, args.heads)),
                     args.causal or key_padding is not None)
    out_dir = prepare_out_dir(args.out) if args.out is not None else None
    trace = explain(
        X, tokens=tokens, d_k=d_k, d_model=d_model, num_heads=args.heads,
        is_causal=args.causal, key_padding=key_padding, scale=1.0 if args.no_scale else None,
        pos=args.pos, Wo=True if (args.wo or args.residual or args.norm) else None,
        residual=args.residual, norm=args.norm, split=args.split, seed=args.seed,
        scheme=args.init,
    )
    if args.fmt == "json":
        print(to_json(trace))
    elif args.fmt == "markdown":
        print(to_markdown(trace, args.lang, precision=args.precision))
    else:
        print(to_text(trace, args.lang, precision=args.precision))
    if out_dir is not None:
        written = save(trace, out_dir, lang=args.lang)
        for path in written:
            print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
    return 0


def _padding(text: str, T: int) -> Any:
    """``--padding 1,1,0``: one 1 (a real token) or 0 (padding) per token -> bool (T,)."""
    import numpy as np

    fields = text.replace(",", " ").split()
    if any(f not in ("0", "1") for f in fields) or len(fields) != T:
        raise CliError(msg("cli.padding", count=T, example=",".join(["1"] * (T - 1) + ["0"]),
                           got=repr(text)))
    return np.array([f == "1" for f in fields])


def _check_printable(T: int, E: int, H: int, D: int, causal: bool) -> None:
    """Refuse sizes whose printout would take minutes and gigabytes (or memory) to make.

    Counts the numbers explain prints: X, Wq/Wk/Wv, then per head Q, K, V,
    scores, scaled, [masked], weights and output, then the concatenation.
    Bad values (d_k < 1, ...) are left to explain's own checks.
    """
    if min(T, E, H, D) < 1:
        return
    per_head = 4 * T * D + (4 if causal else 3) * T * T
    count = T * E + 3 * E * H * D + H * per_head + (T * H * D if H > 1 else 0)
    if count > MAX_PRINTED:
        raise CliError(msg("cli.too_much_to_print", T=T, E=E, H=H, D=D, count=f"{count:,}",
                           limit=f"{MAX_PRINTED:,}"))
