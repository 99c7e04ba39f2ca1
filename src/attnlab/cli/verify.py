"""``attnlab verify MODEL_DIR``: a Hugging Face model on attnlab's float64 plain path, eager and
sdpa over the same padded batch; per layer (and head) the largest error, the first layer
past FlashAttention's 2× rule, and whether the difference is rounding or a bug.

    attnlab verify path/to/model
    attnlab verify path/to/model --text "The cat sat." --text "A longer second sentence." --json
    attnlab verify path/to/model --lang zh

Loads with transformers from the local folder only (no download, never remote code).
Exit status 0 when every candidate is within rounding, 3 when one is past the rule.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from ..messages import msg, render
from .args import CliError, text_argument

EXIT_BUG = 3

DEFAULT_TEXTS = {
    "en": ["The cat sat on the mat because it was tired.", "Attention is all you need."],
    "zh": ["小明去了学校，因为他想学习。", "注意力就是一切。"],
}

def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check a Hugging Face model's attention: float64 plain path vs eager vs sdpa",
        description="Run a Hugging Face model folder on attnlab's float64 plain path, on "
        "eager and on sdpa (and attnlab's fused path) over the same padded batch; print "
        "per layer the largest error of the hidden states and of the weights, the first "
        "layer past FlashAttention's 2x rule and whether the difference is rounding or a "
        "bug. Exit status 3 when a candidate is past the rule.",
    )
    p.add_argument("model", metavar="MODEL_DIR",
                   help="a local model folder (config.json, weights, tokenizer files)")
    p.add_argument("--text", action="append", metavar="TEXT",
                   help="an input text (repeat for a batch; default: two sentences of "
                   "different lengths, so that the batch is padded)")
    p.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32",
                   help="the dtype eager, sdpa and attnlab run in (default float32)")
    p.add_argument("--padding-side", choices=["left", "right"],
                   help="which side to pad (default: the tokenizer's)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the output")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder = Path(args.model)
    if not (folder / "config.json").is_file():
        raise CliError(msg("verify.no_model", got=repr(args.model)))
    texts = [text_argument(t, "--text") for t in (args.text or DEFAULT_TEXTS[args.lang])]
    if any(not t.strip() for t in texts):
        raise CliError(msg("cli.text_empty", flag="--text"))
    import torch

    from ..hf import verify

    model, tokenizer = _load(folder, getattr(torch, args.dtype))
    if args.padding_side:
        tokenizer.padding_side = args.padding_side
    if tokenizer.pad_token is None:  # GPT-2's tokenizer has none
        tokenizer.pad_token = tokenizer.eos_token
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    inputs = {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}
    report = verify(model, inputs)
    if args.json:
        print(json.dumps(report.to_json(), ensure_ascii=False, indent=1))
    else:
        print(report_text(report, args.lang))
    return EXIT_BUG if "bug" in report.verdict.values() else 0


def _load(folder: Path, dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True,
                                            trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                                  trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise CliError(msg("verify.unreadable", path=repr(str(folder)),
                           detail=str(error).splitlines()[0])) from None
    causal = any(name.endswith(("ForCausalLM", "LMHeadModel"))
                 for name in (config.architectures or []))
    auto = AutoModelForCausalLM if causal else AutoModel
    model = auto.from_pretrained(folder, dtype=dtype, local_files_only=True,
                                 trust_remote_code=False, attn_implementation="eager")
    return model.eval(), tokenizer


def report_text(report: Any, lang: str) -> str:
    """The report as a table, in English or Chinese (keys ``verify.*`` of
    :mod:`attnlab.messages`)."""

    def w(key: str, **values: Any) -> str:
        return render(f"verify.{key}", lang, **values)

    names = list(report.layers[0].hidden)  # eager, then the candidates
    title = w("title", model=report.model, dtype=report.dtype, B=report.batch, T=report.tokens)
    if report.padded:
        title += w("padded")
    lines = [title, w("reference", baseline=report.baseline), w("legend"), ""]
    pattern_names = [n for n in names if any(n in e.pattern for e in report.layers)]
    head = [w("layer"), *names, w("budget"), *(w("weights", name=n) for n in pattern_names)]
    rows = [head]
    for e in report.layers:
        row = [str(e.layer), *(_number(e.hidden[n]) for n in names), _number(e.budget)]
        for n in pattern_names:
            heads = e.pattern.get(n)
            row.append("" if not heads else
                       f"{_number(max(heads))} (h{heads.index(max(heads))})")
        rows.append(row)
    widths = [max(_width(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  ".join(cell + " " * (widths[i] - _width(cell))
                               for i, cell in enumerate(r)).rstrip())
    lines.append("")
    for note in report.notes:
        if note == "eager_not_finite":
            lines.append(w("eager_not_finite", baseline=report.baseline))
        elif note.endswith("_unavailable"):
            lines.append(w("unavailable_note", name=note.removesuffix("_unavailable")))
    firsts = ", ".join(f"{n}: {w('none') if layer is None else layer}"
                       for n, layer in report.first_disagreement.items())
    lines.append(w("first", items=firsts))
    lines.append(w("verdict", items=", ".join(f"{n}: {w(v)}" for n, v in report.verdict.items())))
    return "\n".join(lines)


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.1e}"


def _width(text: str) -> int:  # a CJK character takes two columns on a terminal
    return sum(2 if ord(ch) > 0x2E80 else 1 for ch in text)
