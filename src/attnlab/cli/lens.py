"""``attnlab lens``: which heads of a real model matter, by ablation, importance and rollout.

    attnlab lens "The cat sat on the mat." --pair "A cat was sitting on the rug." --out cat/
    attnlab lens "春天的花美" --lang zh --out spring/
    attnlab lens --study --out study/              # every shipped sentence pair

Writes into --out: importance.png (layers × heads), ablation.png (the drop in cosine
agreement when each head is zeroed), rollout.png (attention rollout over TEXT's
tokens) and lens.json; with --study, study.json and the same tables over all the
shipped pairs. Prints the ablation table. Layers and heads are numbered from 1 here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from ..messages import msg, render
from .args import CliError, prepare_out_dir, text_argument

#: ``--analysis`` on a Hugging Face decoder (:mod:`attnlab.cli.lens_hf`).
HF_ANALYSES = ("overview", "patch", "patch-sweep", "path-patch", "dla")
#: The options only the Hugging Face lens reads, with their unset value.
HF_ONLY = (("--analysis", "analysis", "overview"), ("--corrupted", "corrupted", None),
           ("--heads", "heads", None), ("--sender", "sender", None),
           ("--receivers", "receivers", None))


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "lens",
        help="which heads matter: ablation, head importance and attention rollout",
        description="Run a pretrained BERT (default: the packaged all-MiniLM-L6-v2) on TEXT "
        "(and OTHER with --pair) with attnlab's own attention: zero each head and each "
        "layer and measure the drop in cosine agreement with the unablated model, rank "
        "heads by Michel et al.'s importance |dcos/dgate|, and roll the attention out "
        "over the layers. --study does it over the sentence pairs shipped with attnlab.",
    )
    p.add_argument("text", nargs="?", help="the text to look at (not with --study)")
    p.add_argument("--pair", metavar="OTHER",
                   help="a second text: importance and ablation then measure cos(TEXT, OTHER)")
    p.add_argument("--study", action="store_true",
                   help="the whole study over the shipped English and Chinese sentence pairs")
    p.add_argument("--how", choices=["zero", "mean"], default="zero",
                   help="ablate by zeros or by each head's mean output (default zero)")
    p.add_argument("--model", metavar="PATH",
                   help="a BERT directory (config.json, model.safetensors, tokenizer.json) "
                   "instead of the packaged MiniLM, or any Hugging Face decoder folder: "
                   "head ablation, importance, logit lens and detectors through attnlab's "
                   "hook points")
    p.add_argument("--analysis", choices=list(HF_ANALYSES), default="overview",
                   help="Hugging Face decoders only: overview (ablation, importance, logit "
                   "lens, detectors; default), patch (--heads' z from the TEXT run into the "
                   "--corrupted run), patch-sweep (every head alone), path-patch (--sender's "
                   "clean output reaching the output only through --receivers), dla (each "
                   "head's direct contribution to the top token's logit at the last position)")
    p.add_argument("--corrupted", metavar="OTHER",
                   help="the corrupted text (as many tokens as TEXT) for patch, patch-sweep "
                   "and path-patch; the measure is the log-probability, at the last "
                   "position, of the TEXT run's top next token")
    p.add_argument("--heads", metavar="L.H,...",
                   help="the heads --analysis patch patches, LAYER.HEAD from 1, like 1.3,2.1")
    p.add_argument("--sender", metavar="L.H", help="--analysis path-patch: the sender head")
    p.add_argument("--receivers", metavar="L.H,...",
                   help="--analysis path-patch: the receiver heads, in later layers")
    p.add_argument("--out", metavar="DIR", default="attnlab-lens",
                   help="where to write the files (default attnlab-lens/)")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the output")


def table_text(values: np.ndarray, lang: str, scale: float = 1000.0) -> str:
    """An (L, H) table as text, layers and heads from 1, values × ``scale``."""
    zh = lang == "zh"
    L, H = values.shape
    # "层\头" is five columns wide on a terminal (two wide characters), as is "  L\H".
    head = ("层\\头" if zh else "L\\H".rjust(5)) + "".join(f"{h + 1:>7}" for h in range(H))
    rows = [head]
    for layer in range(L):
        rows.append(f"{layer + 1:>5}" + "".join(f"{v * scale:7.2f}" for v in values[layer]))
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..models import load_bert, load_minilm
    from ..report import save_figure
    from ..report.lens_figures import plot_head_table, plot_rollout
    from ..studies.heads import analyse_text, run_head_study

    if args.model is not None and not _is_bert_folder(args.model):
        from .lens_hf import run_transformers_lens

        return run_transformers_lens(args, table_text)
    for flag, dest, unset in HF_ONLY:
        if getattr(args, dest) != unset:
            raise CliError(msg("cli.lens_hf_only", flag=flag))
    zh = args.lang == "zh"
    if args.study == (args.text is not None):
        raise CliError(msg("cli.text_or_study" if args.study else "cli.text_needed"))
    if args.study and args.pair is not None:
        raise CliError(msg("cli.pair_with_study"))
    texts = [] if args.study else [text_argument(args.text, "text")]
    if args.pair is not None:
        texts.append(text_argument(args.pair, "--pair"))
    if any(not t.strip() for t in texts):
        raise CliError(msg("cli.text_empty", flag="text"))
    out = prepare_out_dir(args.out)
    model = load_bert(args.model) if args.model else load_minilm()
    written = []
    if args.study:
        study = run_head_study(model, how=args.how)
        (out / "study.json").write_text(study.to_json() + "\n", encoding="utf-8")
        written.append(out / "study.json")
        drift_title = ("每个头被置零后与原模型的余弦一致度下降" if zh
                       else "drop in cosine agreement when the head is ablated")
        written.append(save_figure(plot_head_table(study.head_drift, title=drift_title,
                                                   lang=args.lang), out / "ablation.png"))
        imp_title = "头的重要性 |∂cos/∂ξ|" if zh else "head importance |dcos/dgate|"
        written.append(save_figure(plot_head_table(study.importance, title=imp_title,
                                                   lang=args.lang), out / "importance.png"))
        _print_study(study, args.lang)
    else:
        result = analyse_text(model, texts[0], texts[1] if len(texts) > 1 else None,
                              how=args.how)
        (out / "lens.json").write_text(result.to_json() + "\n", encoding="utf-8")
        written.append(out / "lens.json")
        written.append(save_figure(plot_head_table(
            result.importance, title=("头的重要性 |∂cos/∂ξ|" if zh else
                                      "head importance |dcos/dgate|"), lang=args.lang),
            out / "importance.png"))
        written.append(save_figure(plot_head_table(
            result.drift, title=("置零后与原模型的余弦一致度下降" if zh else
                                 "drop in cosine agreement when ablated"), lang=args.lang),
            out / "ablation.png"))
        written.append(save_figure(plot_rollout(
            result.rollout, result.tokens,
            title="注意力展开 (rollout)" if zh else "attention rollout", lang=args.lang),
            out / "rollout.png"))
        print("与原模型的余弦一致度下降 (×1000)，每个头单独置零：" if zh else
               "drop in cosine agreement with the unablated model (x1000), each head zeroed:")
        print(table_text(result.drift, args.lang))
        layers = " ".join(f"{v * 1000:.2f}" for v in result.layer_drift)
        print(("整层置零：" if zh else "whole layer zeroed: ") + layers)
        if result.similarity is not None and result.similarity_change is not None:
            print(("cos(TEXT, OTHER) = " if not zh else "cos(文本, 另一文本) = ")
                  + f"{result.similarity:.4f}")
            print("置零每个头后相似度的变化 (×1000)：" if zh else
                  "change of that similarity (x1000), each head zeroed:")
            print(table_text(result.similarity_change, args.lang))
    for path in written:
        print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
    return 0


def _is_bert_folder(path: str) -> bool:
    """A local folder whose config says BERT runs on attnlab's own BERT (lens of
    attnlab.lens); any other model through transformers and attnlab.hf's hook points."""
    config = os.path.join(path, "config.json")
    try:
        with open(config, encoding="utf-8") as handle:
            return bool(json.load(handle).get("model_type") == "bert")
    except (OSError, ValueError):
        return not os.path.exists(path) and path.startswith((".", "/", "~"))


def _print_study(study: Any, lang: str) -> None:
    zh = lang == "zh"
    print(f"{len(study.pairs)} pairs, how={study.how}" if not zh else
          f"{len(study.pairs)} 对句子，消融方式 {study.how}")
    print("与原模型的余弦一致度下降 (×1000)，每个头单独置零：" if zh else
          "drop in cosine agreement with the unablated model (x1000), each head ablated:")
    print(table_text(study.head_drift, lang))
    print(("整层置零：" if zh else "whole layer ablated: ")
          + " ".join(f"{v * 1000:.2f}" for v in study.layer_drift))
    print("头的重要性 |∂cos/∂ξ| (×1000)：" if zh else "head importance |dcos/dgate| (x1000):")
    print(table_text(study.importance, lang))
    names = {"head_drift": ("drift", "一致度下降"), "importance": ("importance", "重要性"),
             "head_similarity_change": ("similarity change", "相似度变化")}
    for measure, (en, zh_name) in names.items():
        top = ", ".join(f"L{layer + 1}H{head + 1} {value * 1000:.2f}"
                        for layer, head, value in study.ranking(measure))
        print(f"按{zh_name}排名前 5 (×1000)：{top}" if zh else f"top 5 by {en} (x1000): {top}")
    for name, table in study.detectors.items():
        order = np.argsort(-table, axis=None, kind="stable")[:3]
        top = ", ".join(f"L{i // table.shape[1] + 1}H{i % table.shape[1] + 1} "
                        f"{table.flat[i]:.3f}" for i in order)
        print(f"{name} 检测分数最高的头：{top}" if zh else f"highest {name} detector scores: {top}")
    for name, value in study.correlations.items():
        print(f"Spearman {name}: " + (f"{value:.3f}" if np.isfinite(value) else "-"))
    for measure in ("head_drift", "importance"):
        means = study.kind_means(measure)
        shown = ", ".join(f"{kind} {'-' if v is None else f'{v * 1000:.2f}'}"
                          for kind, v in means.items())
        en, zh_name = names[measure]
        print(f"各类头的平均{zh_name} (×1000)：{shown}" if zh
              else f"mean {en} by head kind (x1000): {shown}")
