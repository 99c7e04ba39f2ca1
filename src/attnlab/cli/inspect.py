"""``attnlab inspect``: a real pretrained model's attention, drawn, diagnosed and browsable.

    attnlab inspect                                  # "小明去了学校" through all-MiniLM-L6-v2
    attnlab inspect "The cat sat on the mat." --layer 3 --head 5 7 --out cat/

Writes into --out: grid.png (layers × heads heatmaps), head.png (one head at
full size), view.html (the offline interactive viewer) and diagnostics.json,
and prints the diagnostics table. Layers and heads are numbered from 1 here,
as in the printed tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .args import CliError, prepare_out_dir, text_argument

DEFAULT_TEXT = "小明去了学校"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="run a real model (all-MiniLM-L6-v2) on a text and look at every head",
        description="Run a pretrained BERT (default: the packaged all-MiniLM-L6-v2) on TEXT "
        "with attnlab's own attention; write heatmaps, an interactive HTML viewer and "
        "diagnostics (entropy, sparsity, [CLS]/[SEP] sinks, positional heads, head "
        "diversity).",
    )
    p.add_argument("text", nargs="?", default=DEFAULT_TEXT,
                   help=f'the text to run (default "{DEFAULT_TEXT}")')
    p.add_argument("--layer", type=int, nargs="+", metavar="L",
                   help="only these layers (numbered from 1)")
    p.add_argument("--head", type=int, nargs="+", metavar="H",
                   help="only these heads (numbered from 1)")
    p.add_argument("--model", metavar="DIR",
                   help="a BERT directory (config.json, model.safetensors, tokenizer.json) "
                   "instead of the packaged MiniLM")
    p.add_argument("--out", metavar="DIR", default="attnlab-inspect",
                   help="where to write the files (default attnlab-inspect/)")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the output")
    p.add_argument("--format", choices=["table", "json"], default="table", dest="fmt",
                   help="what to print: the diagnostics table or JSON (default table)")


def _select(chosen: list[int] | None, count: int, flag: str) -> list[int]:
    """1-based CLI numbers -> 0-based indices, checked."""
    if chosen is None:
        return list(range(count))
    bad = [c for c in chosen if not 1 <= c <= count]
    if bad:
        raise CliError(f"{flag}: expected numbers in 1..{count}, got {bad[0]}")
    return sorted({c - 1 for c in chosen})


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..lens.diagnostics import diagnose
    from ..lens.heads import all_head_scores
    from ..models import load_bert, load_minilm
    from ..report import (
        AttentionView,
        diagnostics_table,
        plot_attention,
        plot_head_grid,
        save_figure,
    )

    args.text = text_argument(args.text, "text")
    if not args.text.strip():
        raise CliError("text: expected some text, got an empty string")
    out = prepare_out_dir(args.out)
    model = load_bert(args.model) if args.model else load_minilm()
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    layers = _select(args.layer, L, "--layer")
    heads = _select(args.head, H, "--head")
    trace = model.run(args.text, keep=("weights",), layers=layers, heads=heads)
    weights = trace.attention()  # (len(layers), len(heads), T, T)
    tokens = trace.tokens
    diagnostics = diagnose(weights, tokens)
    detectors = all_head_scores(weights, tokens, exclude_bos=True)  # {name: (L, H)}
    report = {**diagnostics.to_dict(), "head_detectors": {
        "exclude_bos": True, **{name: v.tolist() for name, v in detectors.items()}}}

    zh = args.lang == "zh"
    names = [f"第 {layer + 1} 层 · 第 {head + 1} 个头" if zh
             else f"Layer {layer + 1} · Head {head + 1}"
             for layer in layers for head in heads]
    where = f"{model.name}: {args.text}"
    grid = plot_head_grid(weights, tokens, tokens, titles=names, title=where, lang=args.lang)
    written = [save_figure(grid, out / "grid.png")]
    single = plot_attention(weights[0, 0], tokens, tokens, title=f"{names[0]} — {where}",
                            lang=args.lang)
    written.append(save_figure(single, out / "head.png"))
    view = AttentionView(weights, tokens, diagnostics=diagnostics, lang=args.lang,
                         title=f"{where} ({len(layers)} × {len(heads)})")
    written.append(view.save(out / "view.html"))
    report_json = json.dumps(report, ensure_ascii=False, indent=2, allow_nan=False)
    (out / "diagnostics.json").write_text(report_json + "\n", encoding="utf-8")
    written.append(out / "diagnostics.json")

    if args.fmt == "json":
        print(report_json)
    else:
        if len(layers) < L or len(heads) < H:
            chosen_layers, chosen_heads = [i + 1 for i in layers], [h + 1 for h in heads]
            print(f"（表中的层和头按所选范围重新编号：层 {chosen_layers}，头 {chosen_heads}）" if zh
                  else f"(rows numbered within the selection: layers {chosen_layers}, "
                  f"heads {chosen_heads})")
        print(diagnostics_table(diagnostics, args.lang))
        print(_detector_lines(detectors, layers, heads, zh))
    label = "已写入" if zh else "wrote"
    for path in written:
        print(f"{label} {path}", file=sys.stderr)
    if _truncated(model, args.text):
        print(f"note: the text is longer than the model's {len(tokens)} tokens; only its "
              "start was run", file=sys.stderr)
    unknown = _unknown_characters(model, args.text)
    if unknown:
        shown = " ".join(unknown[:10]) + (" …" if len(unknown) > 10 else "")
        print(f"注意：{model.name} 的词表里没有 {shown}，它们被切成 [UNK]（模型看不到它们）" if zh
              else f"note: {model.name}'s vocabulary has no {shown}; they became [UNK] "
              "(the model cannot see them)", file=sys.stderr)
    return 0


def _detector_lines(detectors: dict[str, Any], layers: list[int], heads: list[int],
                    zh: bool) -> str:
    """The best head of each TransformerLens detector, numbered as the model's."""
    names = {"previous_token": "前一个词", "duplicate_token": "重复词", "induction": "归纳"}
    lines = ["头检测（TransformerLens 的得分，不计 [CLS]）：" if zh
             else "head detectors (TransformerLens scores, [CLS] excluded):"]
    for name, scores in detectors.items():
        layer, head = divmod(int(scores.argmax()), scores.shape[1])
        number_l, number_h, best = layers[layer] + 1, heads[head] + 1, float(scores.max())
        lines.append(f"  {names[name]}：第 {number_l} 层第 {number_h} 个头 {best:.3f}" if zh
                     else f"  {name.replace('_', '-')}: layer {number_l} head {number_h} "
                     f"{best:.3f}")
    return "\n".join(lines)


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
