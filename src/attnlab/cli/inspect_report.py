"""What ``attnlab inspect`` writes and prints once a model's weights are read, for
attnlab's own BERT and for any Hugging Face model alike (cli/inspect.py,
cli/inspect_hf.py): the --find table, diagnostics, head detectors, grid.png, head.png,
view.html and diagnostics.json, with layers and heads numbered as the model numbers
them, from 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..messages import msg, render
from .args import CliError

#: Default texts whose every character the model's vocabulary knows (no [UNK]), each
#: with a link worth finding: "it" -> "animal" (the sentence of Google's 2017 Transformer
#: blog post and the Illustrated Transformer; seed 001 speaks of such links), and the second 月
#: ("moon") -> the first one.
DEFAULT_TEXTS = {
    "en": "The animal didn't cross the street because it was too tired.",
    "zh": "天上有月，水中也有月。",
}
DEFAULT_FIND = {"en": "it->animal", "zh": "月->月"}


def select_indices(chosen: list[int] | None, count: int, flag: str) -> list[int]:
    """1-based CLI numbers -> 0-based indices, checked."""
    if chosen is None:
        return list(range(count))
    bad = [c for c in chosen if not 1 <= c <= count]
    if bad:
        raise CliError(msg("cli.numbers_in", flag=flag, count=count, got=bad[0]))
    return sorted({c - 1 for c in chosen})



def report(args: argparse.Namespace, out: Any, weights: Any, tokens: list[str],
           layers: list[int], heads: list[int], *, where: str,
           link: tuple[str, str] | None, rollout_ok: bool, allowed: Any = None,
           view_options: dict[str, Any] | None = None) -> int:
    """What inspect writes and prints once the weights are read, for any model:
    the --find table, diagnostics, head detectors, grid.png, head.png, view.html and
    diagnostics.json. ``view_options`` go to the viewer (decoders, pairs, neuron view)."""
    from ..errors import AttnlabError
    from ..lens.diagnostics import diagnose
    from ..lens.find import find_heads, informative_head
    from ..lens.heads import all_head_scores
    from ..lens.rollout import attention_rollout
    from ..report import (
        AttentionView,
        diagnostics_table,
        plot_attention,
        plot_head_grid,
        save_figure,
    )

    zh = args.lang == "zh"
    found = None
    if link is not None:
        source, target = link
        try:
            found = find_heads(weights, tokens, source, target, top=5)
        except AttnlabError as exc:
            raise CliError(msg("cli.prefixed", flag="--find", inner=exc.message or str(exc))
                           ) from None
        chosen = (found[0].layer, found[0].head)
    else:
        chosen = informative_head(weights, tokens)
    # numbered within the selection (the viewer's); a decoder's rows know their mask
    diagnostics = diagnose(weights, tokens, mask=allowed)
    detectors = all_head_scores(weights, tokens, exclude_bos=True)  # {name: (L', H')}

    def name(layer: int, head: int) -> str:  # the model's own numbers, from 1
        return (f"第 {layers[layer] + 1} 层 · 第 {heads[head] + 1} 个头" if zh
                else f"Layer {layers[layer] + 1} · Head {heads[head] + 1}")

    names = [name(layer, head) for layer in range(len(layers)) for head in range(len(heads))]
    grid = plot_head_grid(weights, tokens, tokens, titles=names, title=where, lang=args.lang)
    written = [save_figure(grid, out / "grid.png")]
    single = plot_attention(weights[chosen], tokens, tokens,
                            title=f"{name(*chosen)} — {where}", lang=args.lang)
    written.append(save_figure(single, out / "head.png"))
    # Rollout needs every layer and head: with a selection the page shows the weights only.
    rollout = attention_rollout(weights) if rollout_ok else None
    view = AttentionView(weights, tokens, diagnostics=diagnostics, lang=args.lang,
                         title=f"{where} ({len(layers)} × {len(heads)})",
                         layers=layers, heads=heads, rollout=rollout,
                         start=chosen, **(view_options or {}))
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
    for path in written:
        print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
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
