"""``attnlab inspect``: a real pretrained model's attention, drawn, diagnosed and browsable.

    attnlab inspect                     # "it" -> "animal" on all-MiniLM-L6-v2
    attnlab inspect --lang zh           # 天上有月，水中也有月。
    attnlab inspect "The cat sat on the mat." --layer 3 --head 5 7 --out cat/
    attnlab inspect "..." --find "cat->mat" --max-length 512
    attnlab inspect --model ./my-llama "The cat sat." --generate 8   # any HF folder
    attnlab inspect "The cat sat." --pair "It was warm."             # sentence A/B

Writes into --out: grid.png (layers × heads heatmaps), head.png (one head at
full size: the strongest --find head, else the head looking hardest at one other
token), view.html (the offline interactive viewer) and diagnostics.json, and
prints notes about the text first, then the --find table, then the diagnostics.
Layers and heads keep the model's own numbers, counted from 1, everywhere: the
flags, the tables, the viewer and diagnostics.json (which says
``"numbered_from": 1``), whatever --layer / --head select.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ..messages import msg
from .args import CliError, prepare_out_dir, text_argument
from .inspect_report import DEFAULT_FIND, DEFAULT_TEXTS, report, select_indices

__all__ = ["DEFAULT_FIND", "DEFAULT_TEXTS", "add_parser", "run"]

def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="run a real model (all-MiniLM-L6-v2) on a text and look at every head",
        description="Run a pretrained BERT (default: the packaged all-MiniLM-L6-v2) on TEXT "
        "with attnlab's own attention; write heatmaps, an interactive HTML viewer and "
        "diagnostics (entropy, sparsity, [CLS]/[SEP] sinks, positional heads, head "
        "diversity).",
    )
    p.add_argument("text", nargs="?", default=None,
                   help=f'the text to run (default "{DEFAULT_TEXTS["en"]}", or with --lang zh '
                   f'"{DEFAULT_TEXTS["zh"]}")')
    p.add_argument("--layer", type=int, nargs="+", metavar="L",
                   help="only these layers (numbered from 1)")
    p.add_argument("--head", type=int, nargs="+", metavar="H",
                   help="only these heads (numbered from 1)")
    p.add_argument("--model", metavar="PATH",
                   help="a Hugging Face folder (or a hub name, where the hub can be reached), "
                   "encoder or decoder, with its own tokenizer; BERT folders run on "
                   "attnlab's own attention, others through transformers on attnlab's "
                   "registered attention, read at its hook points "
                   "(default: the packaged MiniLM)")
    p.add_argument("--pair", metavar="TEXT",
                   help="a second sentence (sentence B), run with TEXT as one sentence pair "
                   "([CLS] A [SEP] B [SEP], token types 0 then 1); for Hugging Face models "
                   "the page gets A/B filters")
    p.add_argument("--generate", type=int, metavar="N", default=0,
                   help="decoders: generate N tokens greedily after TEXT; the page shows the "
                   "prompt and generated tokens apart and a step slider over the KV cache")
    p.add_argument("--ablation", action="store_true",
                   help="also zero each head alone and show how much the output changes "
                   "(||y_ablated - y|| / ||y||) in the page's head table; one more run per "
                   "head (through transformers and attnlab's hook points)")
    p.add_argument("--trust-remote-code", action="store_true", dest="trust_remote_code",
                   help="let transformers run code shipped in the model folder (never by "
                   "default)")
    p.add_argument("--out", metavar="DIR", default="attnlab-inspect",
                   help="where to write the files (default attnlab-inspect/)")
    p.add_argument("--find", metavar="A->B",
                   help='list the heads putting the most weight from token A onto token B, '
                   'e.g. "it->animal" (default for the default text)')
    p.add_argument("--max-length", type=int, metavar="N", dest="max_length",
                   help="run at most N tokens (up to the model's positions: 512 for MiniLM; "
                   "default: the model's configured length, 256 for MiniLM)")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the output")
    p.add_argument("--format", choices=["table", "json"], default="table", dest="fmt",
                   help="what to print: the diagnostics table or JSON (default table)")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..errors import AttnlabError
    from ..lens.find import parse_link
    from ..models.loading import load_bert, minilm_path

    if _through_transformers(args):
        from .inspect_hf import run_transformers

        return run_transformers(args)
    zh = args.lang == "zh"
    default_text = args.text is None
    text = DEFAULT_TEXTS[args.lang] if default_text else text_argument(args.text, "text")
    if not text.strip():
        raise CliError(msg("cli.text_empty", flag="text"))
    link = args.find if args.find is not None else (DEFAULT_FIND[args.lang] if default_text
                                                     else None)
    if link is not None:
        try:
            source, target = parse_link(text_argument(link, "--find"), "--find")
        except AttnlabError as exc:
            raise CliError(exc.message or str(exc)) from None
    if args.max_length is not None and args.max_length < 1:
        raise CliError(msg("cli.max_length", got=args.max_length))
    out = prepare_out_dir(args.out)
    try:
        model = (load_bert(args.model, max_length=args.max_length) if args.model else
                 load_bert(minilm_path(), max_length=args.max_length, name="all-MiniLM-L6-v2"))
    except AttnlabError as exc:
        if exc.message is not None and exc.message.key == "models.max_length":
            raise CliError(msg("models.max_length", **{**exc.message.params,
                                                       "name": "--max-length"})) from None
        raise
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    layers = select_indices(args.layer, L, "--layer")
    heads = select_indices(args.head, H, "--head")
    pair = None if args.pair is None else text_argument(args.pair, "--pair")
    if pair is not None and not pair.strip():
        raise CliError(msg("cli.text_empty", flag="--pair"))
    trace = model.run(text, text_pair=pair, keep=("weights",), layers=layers, heads=heads)
    weights = trace.attention()  # (len(layers), len(heads), T, T)
    tokens = trace.tokens

    # Notes about the text come first: they change how everything below reads.
    unknown = _unknown_characters(model, text)
    if unknown:
        shown = " ".join(unknown[:10]) + (" …" if len(unknown) > 10 else "")
        print(f"注意：{model.name} 的词表里没有 {shown}，它们被切成 [UNK]（模型看不到它们）" if zh
              else f"note: {model.name}'s vocabulary has no {shown}; they became [UNK] "
              "(the model cannot see them)", file=sys.stderr)
    if _truncated(model, text):
        limit = model.config.max_position_embeddings
        print(f"注意：文本超过 {len(tokens)} 个词元，只运行了开头部分（--max-length 最多可到 "
              f"{limit}）" if zh else f"note: the text is longer than {len(tokens)} tokens; "
              f"only its start was run (--max-length goes up to {limit})", file=sys.stderr)

    return report(args, out, weights, tokens, layers, heads, where=f"{model.name}: {text}",
                  link=(source, target) if link is not None else None,
                  rollout_ok=(len(layers), len(heads)) == (L, H))


def _through_transformers(args: argparse.Namespace) -> bool:
    """Pairs, generation, remote code, ablation and any model but a local BERT folder run through
    transformers (attnlab.lens.hf_runs); MiniLM, BERT folders and folders whose config.json
    is not a readable JSON object on attnlab's own BERT, whose reader says what is wrong."""
    if args.pair is not None or args.generate or args.trust_remote_code or args.ablation:
        return True
    if args.model is None:
        return False
    config = os.path.join(args.model, "config.json")
    if not os.path.isfile(config):
        return True  # a hub name, or a folder load_hf will name as not a model
    try:
        with open(config, encoding="utf-8") as handle:
            settings = json.load(handle)
    except (OSError, ValueError):
        return False  # attnlab's own reader names what is wrong with the file
    if not isinstance(settings, dict):
        return False  # likewise: "expected a JSON object of settings"
    return settings.get("model_type") != "bert"


def _unknown_characters(model: Any, text: str) -> list[str]:
    """The pieces of ``text`` that the tokenizer could only turn into [UNK], in order."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return []
    encoding = tokenizer.encode(text)
    found: list[str] = []
    for token, (start, end) in zip(encoding.tokens, encoding.offsets, strict=True):
        piece = text[start:end]
        if token == "[UNK]" and piece and piece not in found:
            found.append(piece)
    return found


def _truncated(model: Any, text: str) -> bool:
    """Whether the tokenizer cut ``text`` to the model's max_length."""
    tokenizer = getattr(model, "tokenizer", None)
    return tokenizer is not None and bool(tokenizer.encode(text).overflowing)
