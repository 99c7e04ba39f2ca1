"""``attnlab profile``: where a BERT forward pass spends its time and FLOPs.

    attnlab profile                                  # MiniLM + BERT-base shape, T = 128, 512, 2048
    attnlab profile --models bert-base --seq-lens 256,1024 --repeats 5 --threads 2
    attnlab profile --quick --json                   # a tiny model, seconds
    attnlab profile --out results/                   # also profile.json and profile_shares.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from ..messages import Message, msg, render, render_value
from ..report.text import check_lang, display_width
from ..report.words import Lang
from .args import CliError, check_memory, int_list, prepare_out_dir

MODEL_CHOICES = ("minilm", "bert-base", "tiny")
DEFAULT_MODELS = "minilm,bert-base"
DEFAULT_SEQ_LENS = "128,512,2048"
QUICK_SEQ_LENS = "16,32"
DEFAULT_REPEATS = 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile",
        help="share of time and FLOPs in attention vs feed-forward, for MiniLM and BERT-base",
        description="Time a BERT forward pass module by module (the real blocks' attention, "
        "feed-forward and LayerNorm calls, the rest) and count its FLOPs part by part "
        "(Q/K/V/output projections, QKᵀ, softmax, ·V, feed-forward, the rest), at several "
        "sequence lengths.",
    )
    p.add_argument("--models", default=None,
                   help=f"comma-separated, from {', '.join(MODEL_CHOICES)} "
                   f"(default {DEFAULT_MODELS}; --quick: tiny)")
    p.add_argument("--seq-lens", default=None, metavar="T,T,...",
                   help=f"sequence lengths (default {DEFAULT_SEQ_LENS}; --quick: {QUICK_SEQ_LENS})")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed runs per T, the median is reported (default {DEFAULT_REPEATS}; "
                   "--quick: 1)")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    p.add_argument("--batch", type=int, default=1, help="sequences per forward (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of token ids and random weights")
    p.add_argument("--no-compare", action="store_true",
                   help="do not also time the plain forward (without timing hooks)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny 2-layer model at T = 16, 32, one run: checks the pipeline")
    p.add_argument("--json", action="store_true", help="print the report as JSON, not a table")
    p.add_argument("--lang", choices=["en", "zh"], default="en",
                   help="language of the tables and plots (default en)")
    p.add_argument("--out", metavar="DIR", help="also write profile.json (and profile_shares.png "
                   "if matplotlib is installed) here")


def _positive(value: int, option: str) -> int:
    if value < 1:
        raise CliError(msg("cli.positive", flag=option, got=value))
    return value


def _model_names(text: str) -> list[str]:
    names = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [n for n in names if n not in MODEL_CHOICES]
    if not names or unknown:
        raise CliError(msg("cli.names_from", flag="--models", names=", ".join(MODEL_CHOICES),
                           got=repr(text)))
    return list(dict.fromkeys(names))


def _build_models(names: list[str], longest: int, seed: int
                  ) -> tuple[dict[str, Any], dict[str, list[Message]], dict[str, Message]]:
    """The models by English name, with their notes and titles as keyed messages."""
    from ..studies.profile import BERT_BASE, TINY, random_bert

    models: dict[str, Any] = {}
    notes: dict[str, list[Message]] = {}
    titles: dict[str, Message] = {}
    for name in names:
        title = msg({"minilm": "profile.model.minilm", "bert-base": "profile.model.bert_base",
                     "tiny": "profile.model.tiny"}[name])
        label = str(title)
        titles[label] = title
        if name == "minilm":
            from ..models import load_minilm

            models[label] = load_minilm()
            notes[label] = [msg("profile.note.real_weights")]
            continue
        base = BERT_BASE if name == "bert-base" else TINY
        config = dataclasses.replace(
            base, max_position_embeddings=max(base.max_position_embeddings, longest))
        models[label] = random_bert(config, seed=seed, name=label)
        notes[label] = [msg("profile.note.random_weights", rows=config.max_position_embeddings)]
    return models, notes, titles


def _check_sizes(names: list[str], seq_lens: list[int], batch: int) -> None:
    """Refuse T and batch whose (B, H, T, T) score matrices cannot be held, before any work."""
    from ..attention import MAX_SCORE_ELEMENTS
    from ..studies.profile import BERT_BASE, TINY

    heads = max({"minilm": 12, "bert-base": BERT_BASE.num_attention_heads,
                 "tiny": TINY.num_attention_heads}[name] for name in names)
    T = max(seq_lens)
    n_scores = batch * heads * T * T
    if n_scores > MAX_SCORE_ELEMENTS:
        raise CliError(msg("cli.profile_scores", T=T, batch=batch, heads=heads,
                           count=f"{n_scores:,}", limit=f"{MAX_SCORE_ELEMENTS:,}"))
    # A block's attention holds about five float32 arrays of the scores' size at once.
    check_memory(5 * 4 * n_scores, "--seq-lens/--batch",
                 msg("cli.profile_what", T=T, batch=batch, heads=heads))


def run(args: argparse.Namespace) -> int:
    names = _model_names(args.models if args.models is not None
                         else ("tiny" if args.quick else DEFAULT_MODELS))
    seq_lens = list(int_list(args.seq_lens if args.seq_lens is not None
                             else (QUICK_SEQ_LENS if args.quick else DEFAULT_SEQ_LENS),
                             "--seq-lens", example="128,512"))
    repeats = _positive(args.repeats if args.repeats is not None
                        else (1 if args.quick else DEFAULT_REPEATS), "--repeats")
    threads = _positive(args.threads, "--threads")
    batch = _positive(args.batch, "--batch")
    if args.seed < 0:
        raise CliError(msg("check.integer_at_least", name="--seed", low=0, got=args.seed))
    _check_sizes(names, seq_lens, batch)
    folder = prepare_out_dir(args.out) if args.out is not None else None

    from ..studies.profile import plot_shares, profile

    models, notes, titles = _build_models(names, max(seq_lens), args.seed)
    report = profile(models, seq_lens, repeats=repeats, threads=threads, batch=batch,
                     seed=args.seed, compare_forward=not args.no_compare, notes=notes,
                     titles=titles)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print(format_report(report, args.lang))
    if folder is not None:
        path = folder / "profile.json"
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
        try:
            from ..report.figures import save_figure

            png = save_figure(plot_shares(report, args.lang), folder / "profile_shares.png")
            print(render("cli.wrote", args.lang, path=png), file=sys.stderr)
        except ImportError as exc:
            print(render("cli.no_plot", args.lang, reason=exc), file=sys.stderr)
    return 0


# ---------------------------------------------------------------------- table

_COLUMNS = (("QKV", "qkv_projection"), ("QKᵀ", "scores"), ("softmax", "softmax"),
            ("·V", "weighted_sum"), ("Wo", "output_projection"))


def _pct(x: float) -> str:
    return f"{100 * x:5.1f}%"


def _pct_or_dash(x: float | None) -> str:
    """A share, or "–" for a part that is not timed on its own."""
    return "–" if x is None else _pct(x)


def _fmt_flops(flops: int) -> str:
    for unit, size in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if flops >= size:
            return f"{flops / size:,.2f} {unit}"
    return f"{flops} FLOP"


def _fmt_T(value: float | None, lang: Lang) -> str:
    return render("study.never", lang) if value is None else f"{value:,.0f}"


def _count(key: str, n: int) -> Message:
    """``key.one`` or ``key.many``, by ``n``."""
    return msg(f"{key}.{'one' if n == 1 else 'many'}", n=n)


def format_report(report: dict[str, Any], lang: Lang = "en") -> str:
    """The terminal table in ``lang``: per model and T, time and FLOP shares of each part
    and group.

    Time is measured per module (attention, feed-forward, the rest); the attention call
    is one module, so its split into projections and core (QKᵀ, softmax, ·V) is in FLOPs.
    """
    lang = check_lang(lang)
    s = report["settings"]
    lines = [render("profile.title", lang, batch=s["batch"], dtype=s["dtype"],
                    threads=_count("study.blas_threads", s["threads"]),
                    median=_count("study.median_runs", s["repeats"]),
                    lengths=", ".join(map(str, s["seq_lens"])))]
    head = ("      T        " + " ".join(f"{c:>7}" for c, _ in _COLUMNS) + " "
            + render("profile.columns", lang))
    kinds = {"time": render("study.time", lang), "FLOPs": "FLOPs"}
    for entry in report["models"]:
        sh = entry["shape"]
        title = render_value(entry.get("title", entry["name"]), lang)
        lines += ["", f"{title} — L={sh['layers']} E={sh['width']} H={sh['heads']} "
                  f"D={sh['head_dim']} F={sh['ffn']}"]
        lines += [render("study.note", lang, text=render_value(note, lang))
                  for note in entry["notes"]]
        lines.append(head)
        for r in entry["runs"]:
            for kind, key in (("time", "time_share"), ("FLOPs", "flop_share")):
                share = r[key]
                cells = " ".join(f"{_pct_or_dash(share.get(part)):>7}" for _, part in _COLUMNS)
                if kind == "time":
                    total = f"{1e3 * r['total_s']:,.1f} ms"
                    if r["forward_s"] is not None:
                        total += render("profile.plain_forward", lang,
                                        ms=f"{1e3 * r['forward_s']:,.1f}")
                    first = f"{r['T']:>7}"
                else:
                    total = _fmt_flops(r["total_flops"])
                    first = " " * 7
                word = kinds[kind] + " " * max(5 - display_width(kinds[kind]), 0)
                lines.append(f"{first}  {word} {cells} │    {_pct(share['attention'])} "
                             f"({_pct_or_dash(share.get('attention_core')):>6}) │ "
                             f"{_pct(share['feed_forward'])}  {_pct(share['rest'])} │ {total}")
        E, H, F = sh["width"], sh["heads"], sh["ffn"]
        c = entry["crossovers"]
        lines += [
            render("profile.time_note", lang),
            render("profile.flops_note", lang, linear=f"{8 * E * E + 4 * E:,}",
                   square=f"{4 * E + 6 * H:,}", ffn=f"{4 * E * F + 6 * F + E:,}"),
            render("profile.crossover_note", lang, core=_fmt_T(c["core_vs_ffn"], lang),
                   full=_fmt_T(c["attention_vs_ffn"], lang)),
            render("profile.share_note", lang, full=_fmt_T(c["attention_share"], lang),
                   core=_fmt_T(c["core_share"], lang)),
        ]
    return "\n".join(lines)
