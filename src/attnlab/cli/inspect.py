"""``attnlab inspect``: a real pretrained model's attention, drawn, diagnosed and browsable.

    attnlab inspect                     # "it" -> "animal" on all-MiniLM-L6-v2
    attnlab inspect --lang zh           # 天上有月，水中也有月。
    attnlab inspect "The cat sat on the mat." --layer 3 --head 5 7 --out cat/
    attnlab inspect "..." --find "cat->mat" --max-length 512

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

#: Default texts whose every character the model's vocabulary knows (no [UNK]), each
#: with a link worth finding: "it" -> "animal" (the sentence of Google's 2017 Transformer
#: blog post and the Illustrated Transformer; seed 001 speaks of such links), and the second 月
#: ("moon") -> the first one.
DEFAULT_TEXTS = {
    "en": "The animal didn't cross the street because it was too tired.",
    "zh": "天上有月，水中也有月。",
}
DEFAULT_FIND = {"en": "it->animal", "zh": "月->月"}


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
    p.add_argument("--pair", metavar="OTHER",
                   help="a second text: run TEXT and OTHER as a sentence pair ([CLS] TEXT [SEP] "
                   "OTHER [SEP], token types 0 then 1), as BERT reads pairs")
    p.add_argument("--layer", type=int, nargs="+", metavar="L",
                   help="only these layers (numbered from 1)")
    p.add_argument("--head", type=int, nargs="+", metavar="H",
                   help="only these heads (numbered from 1)")
    p.add_argument("--model", metavar="DIR",
                   help="a BERT directory (config.json, model.safetensors, tokenizer.json) "
                   "instead of the packaged MiniLM")
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


def _select(chosen: list[int] | None, count: int, flag: str) -> list[int]:
    """1-based CLI numbers -> 0-based indices, checked."""
    if chosen is None:
        return list(range(count))
    bad = [c for c in chosen if not 1 <= c <= count]
    if bad:
        raise CliError(msg("cli.numbers_in", flag=flag, count=count, got=bad[0]))
    return sorted({c - 1 for c in chosen})


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..errors import AttnlabError
    from ..lens.diagnostics import diagnose
    from ..lens.find import find_heads, informative_head, parse_link
    from ..lens.heads import all_head_scores
    from ..lens.rollout import attention_rollout
    from ..models.loading import load_bert, minilm_path
    from ..report import (
        AttentionView,
        diagnostics_table,
        plot_attention,
        plot_head_grid,
        save_figure,
    )

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
    layers = _select(args.layer, L, "--layer")
    heads = _select(args.head, H, "--head")
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

    found = None
    if link is not None:
        try:
            found = find_heads(weights, tokens, source, target, top=5)
        except AttnlabError as exc:
            raise CliError(msg("cli.prefixed", flag="--find", inner=exc.message or str(exc))
                           ) from None
        chosen = (found[0].layer, found[0].head)
    else:
        chosen = informative_head(weights, tokens)
    diagnostics = diagnose(weights, tokens)  # numbered within the selection (the viewer's)
    detectors = all_head_scores(weights, tokens, exclude_bos=True)  # {name: (L', H')}

    def name(layer: int, head: int) -> str:  # the model's own numbers, from 1
        return (f"第 {layers[layer] + 1} 层 · 第 {heads[head] + 1} 个头" if zh
                else f"Layer {layers[layer] + 1} · Head {heads[head] + 1}")

    names = [name(layer, head) for layer in range(len(layers)) for head in range(len(heads))]
    where = f"{model.name}: {text}"
    grid = plot_head_grid(weights, tokens, tokens, titles=names, title=where, lang=args.lang)
    written = [save_figure(grid, out / "grid.png")]
    single = plot_attention(weights[chosen], tokens, tokens,
                            title=f"{name(*chosen)} — {where}", lang=args.lang)
    written.append(save_figure(single, out / "head.png"))
    # Rollout needs every layer and head: with a selection the page shows the weights only.
    rollout = attention_rollout(weights) if (len(layers), len(heads)) == (L, H) else None
    view = AttentionView(weights, tokens, diagnostics=diagnostics, lang=args.lang,
                         title=f"{where} ({len(layers)} × {len(heads)})",
                         layers=layers, heads=heads, rollout=rollout)
    written.append(view.save(out / "view.html"))
    numbered = _numbered_from_one(diagnostics.to_dict(), layers, heads)
    numbered["head_detectors"] = {"exclude_bos": True, **{
        name: scores.tolist() for name, scores in detectors.items()}}
    if found is not None:
        numbered["find"] = {"source": source, "target": target, "heads": [
            {"layer": layers[f.layer] + 1, "head": heads[f.head] + 1, "query": f.query,
             "key": f.key, "weight": round(f.weight, 6)} for f in found]}
    report = json.dumps(numbered, ensure_ascii=False, indent=2, allow_nan=False)
    (out / "diagnostics.json").write_text(report + "\n", encoding="utf-8")
    written.append(out / "diagnostics.json")

    if args.fmt == "json":
        print(report)
    else:
        if found is not None:
            print(f"从“{source}”到“{target}”权重最大的头：" if zh
                  else f"heads putting the most weight from {source!r} onto {target!r}:")
            print("  层  头  权重" if zh else "  layer  head  weight")
            for f in found:
                print(f"  {layers[f.layer] + 1:>2}  {heads[f.head] + 1:>2}  {f.weight:.3f}" if zh
                      else f"  {layers[f.layer] + 1:>5}  {heads[f.head] + 1:>4}  {f.weight:.3f}")
            print()
        print(diagnostics_table(_renumbered(diagnostics, layers, heads), args.lang))
        print(_detector_lines(detectors, layers, heads, zh))
    label = "已写入" if zh else "wrote"
    for path in written:
        print(f"{label} {path}", file=sys.stderr)
    return 0


def _renumbered(diagnostics: Any, layers: list[int], heads: list[int]) -> Any:
    """The same diagnostics with the model's own (0-based) layer and head numbers."""
    import dataclasses

    records = [dataclasses.replace(h, layer=layers[h.layer], head=heads[h.head])
               for h in diagnostics.heads]
    summaries = [dataclasses.replace(
        layer, layer=layers[layer.layer],
        closest_pair=None if layer.closest_pair is None else (
            heads[layer.closest_pair[0]], heads[layer.closest_pair[1]], layer.closest_pair[2]),
        near_duplicates=[(heads[a], heads[b], d) for a, b, d in layer.near_duplicates])
        for layer in diagnostics.layers]
    return dataclasses.replace(diagnostics, heads=records, layers=summaries)


def _numbered_from_one(report: dict[str, Any], layers: list[int],
                       heads: list[int]) -> dict[str, Any]:
    """diagnostics.to_dict() with every layer and head as the model numbers it, from 1."""
    for record in report["heads"]:
        record["layer"], record["head"] = layers[record["layer"]] + 1, heads[record["head"]] + 1
    for layer in report["layers"]:
        layer["layer"] = layers[layer["layer"]] + 1
        if layer["closest_pair"] is not None:
            a, b, d = layer["closest_pair"]
            layer["closest_pair"] = [heads[a] + 1, heads[b] + 1, d]
        layer["near_duplicates"] = [[heads[a] + 1, heads[b] + 1, d]
                                    for a, b, d in layer["near_duplicates"]]
        layer["heads"] = [h + 1 for h in heads]  # the rows and columns of js_distance
    return {"numbered_from": 1, **report}


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
