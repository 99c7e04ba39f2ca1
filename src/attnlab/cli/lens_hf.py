"""``attnlab lens --model PATH`` for a Hugging Face causal language model.

    attnlab lens --model ./my-llama "The cat sat on the mat because it was warm."

The model runs on attnlab's attention (:func:`attnlab.hf.register`), so its hook points
(``blocks.{l}.attn.hook_z``, ``blocks.{l}.hook_resid_post``) carry every intervention
(:mod:`attnlab.lens.hf_lens`). The measure is the mean log-probability the model gives
each next token of TEXT. Prints and writes to --out/lens.json: the drop of that measure
when each head is ablated (--how zero or mean), each head's importance |∂measure/∂gate|,
the logit lens (each layer's top next token at the last position) and the
previous-token / duplicate-token / induction detectors on a random sequence repeated
twice. Layers and heads are numbered from 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from ..messages import msg
from .args import CliError, prepare_out_dir, text_argument


def run_transformers_lens(args: argparse.Namespace, table_text: Callable[..., str]) -> int:
    import torch

    from .. import hf
    from ..errors import AttnlabError
    from ..lens.hf_lens import ablate_heads, head_importance, logit_lens, repeated_tokens_scores
    from ..lens.hf_runs import load_hf

    zh = args.lang == "zh"
    if args.study or args.pair is not None:
        raise CliError(msg("cli.lens_model_text_only"))
    if args.text is None:
        raise CliError(msg("cli.text_needed"))
    text = text_argument(args.text, "text")
    if not text.strip():
        raise CliError(msg("cli.text_empty", flag="text"))
    out = prepare_out_dir(args.out)
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    hf.register()
    try:
        loaded = load_hf(args.model, attn_implementation="attnlab")
    except AttnlabError as exc:
        message = exc.message
        if message is not None and message.params.get("name") == "model":
            raise CliError(msg(message.key, **{**message.params, "name": "--model"})) from None
        raise
    if not loaded.is_decoder:
        raise CliError(msg("cli.lens_model_decoder", model=loaded.name))
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = tokenizer(text, return_tensors="pt", truncation=True)["input_ids"]  # (1, T)
    if ids.shape[1] < 2:
        raise CliError(msg("cli.lens_model_short", count=int(ids.shape[1])))

    def measure(output: Any) -> Any:  # mean log-probability of each next token
        logprobs = torch.log_softmax(output.logits[0, :-1].float(), dim=-1)  # (T-1, V)
        return logprobs.gather(1, ids[0, 1:, None]).mean()

    L, H = loaded.num_layers, loaded.num_heads
    with torch.no_grad():
        base = float(measure(model(input_ids=ids)))
        drop = np.array([[base - float(measure(ablate_heads(model, [(layer, head)],
                                                             how=args.how, input_ids=ids)))
                          for head in range(H)] for layer in range(L)])  # (L, H)
    importance = head_importance(model, measure, input_ids=ids)  # (L, H)
    lens, _ = logit_lens(model, input_ids=ids)  # (L, T, V)
    top = [tokenizer.convert_ids_to_tokens(int(lens[layer, -1].argmax())) for layer in range(L)]
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else (
        tokenizer.bos_token_id)
    detectors = repeated_tokens_scores(model, first=first)

    print(f"每个下一个词元的平均对数概率：{base:.4f}" if zh
          else f"mean log-probability of each next token: {base:.4f}")
    print(f"每个头被{'置零' if args.how == 'zero' else '换成均值'}后它的下降 (×1000)：" if zh
          else f"its drop when each head is {args.how}-ablated (x1000):")
    print(table_text(drop, args.lang))
    print("头的重要性 |∂量/∂门| (×1000)：" if zh
          else "head importance |d measure / d gate| (x1000):")
    print(table_text(importance, args.lang))
    print("logit lens（最后一个位置，每层排第一的词元）：" if zh
          else "logit lens (last position, each layer's top token):")
    print("  " + "  ".join(f"{layer + 1}:{token}" for layer, token in enumerate(top)))
    for name, scores in detectors.items():
        layer, head = divmod(int(scores.argmax()), H)
        print(f"  {name}: L{layer + 1}H{head + 1} {float(scores.max()):.3f}")
    report = {
        "numbered_from": 1, "model": loaded.name, "text": text,
        "tokens": tokenizer.convert_ids_to_tokens(ids[0].tolist()), "how": args.how,
        "mean_next_token_logprob": base, "ablation_drop": drop.round(8).tolist(),
        "importance": importance.round(8).tolist(), "logit_lens_top": top,
        "detectors": {name: scores.round(6).tolist() for name, scores in detectors.items()},
    }
    (out / "lens.json").write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n",
                                   encoding="utf-8")
    print(f"{'已写入' if zh else 'wrote'} {out / 'lens.json'}", file=sys.stderr)
    return 0
