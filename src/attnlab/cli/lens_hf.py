"""``attnlab lens --model PATH`` for a Hugging Face causal language model.

    attnlab lens --model ./my-llama "The cat sat on the mat because it was warm."
    attnlab lens --model ./my-llama "The cat sat on the" --corrupted "The dog sat on the" \
        --analysis patch-sweep
    attnlab lens --model ./my-llama "The cat sat on the" --corrupted "The dog sat on the" \
        --analysis path-patch --sender 1.2 --receivers 2.1,2.4

The model runs on attnlab's attention (:func:`attnlab.hf.register`), so its hook points
(``blocks.{l}.attn.hook_z``, ``blocks.{l}.hook_resid_post``) carry every intervention
(:mod:`attnlab.lens.hf_lens`). The measure is the mean log-probability the model gives
each next token of TEXT. Prints and writes to --out/lens.json: the drop of that measure
when each head is ablated (--how zero or mean), each head's importance |∂measure/∂gate|,
the logit lens (each layer's top next token at the last position) and the
previous-token / duplicate-token / induction detectors on a random sequence repeated
twice (``--analysis overview``, the default). The other analyses:

- ``patch``: the corrupted text run with ``--heads``' z taken from TEXT's run;
- ``patch-sweep``: the same for every head alone, an (L, H) table;
- ``path-patch``: ``--sender``'s z from TEXT's run reaching the output only through
  ``--receivers`` (:func:`attnlab.lens.hf_lens.path_patch`);
- ``dla``: each head's direct contribution to the logit of the top next token at the
  last position (:func:`attnlab.lens.hf_lens.direct_logit_attribution`).

The patching measure is the log-probability, at the last position, of TEXT's top next
token ("the answer"): TEXT's run gives the most, ``--corrupted``'s less, and a patched
run shows how much of that gap a head (or a path) restores. Layers and heads are
numbered from 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from ..messages import msg, render
from .args import CliError, prepare_out_dir, text_argument


def run_transformers_lens(args: argparse.Namespace, table_text: Callable[..., str]) -> int:
    from .. import hf
    from ..errors import AttnlabError
    from ..lens.hf_runs import load_hf

    zh = args.lang == "zh"
    if args.study or args.pair is not None:
        raise CliError(msg("cli.lens_model_text_only"))
    if args.text is None:
        raise CliError(msg("cli.text_needed"))
    text = text_argument(args.text, "text")
    if not text.strip():
        raise CliError(msg("cli.text_empty", flag="text"))
    _check_analysis_flags(args)
    corrupted_text = None
    if args.corrupted is not None:
        corrupted_text = text_argument(args.corrupted, "--corrupted")
        if not corrupted_text.strip():
            raise CliError(msg("cli.text_empty", flag="--corrupted"))
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
    report: dict[str, Any] = {
        "numbered_from": 1, "model": loaded.name, "text": text, "analysis": args.analysis,
        "tokens": tokenizer.convert_ids_to_tokens(ids[0].tolist()),
    }
    if args.analysis == "dla":
        report.update(_attribution(model, tokenizer, ids, zh, table_text))
    elif args.analysis != "overview":
        corrupted = tokenizer(corrupted_text, return_tensors="pt", truncation=True)["input_ids"]
        if corrupted.shape != ids.shape:
            raise CliError(msg("cli.lens_corrupted_tokens", want=int(ids.shape[1]),
                               got=int(corrupted.shape[1])))
        report["corrupted"] = corrupted_text
        report["corrupted_tokens"] = tokenizer.convert_ids_to_tokens(corrupted[0].tolist())
        report.update(_patching(args, model, tokenizer, ids, corrupted,
                                (loaded.num_layers, loaded.num_heads), table_text))
    else:
        report.update(_overview(args, loaded, ids, table_text))
    (out / "lens.json").write_text(json.dumps(report, ensure_ascii=False, indent=2) + "\n",
                                   encoding="utf-8")
    print(render("cli.wrote", args.lang, path=out / "lens.json"), file=sys.stderr)
    return 0


_PATCHING = ("patch", "patch-sweep", "path-patch")


def _check_analysis_flags(args: argparse.Namespace) -> None:
    """Each option with the analysis that reads it, before the model is loaded."""
    analysis = args.analysis
    used = {"--corrupted": (args.corrupted, " | ".join(_PATCHING)),
            "--heads": (args.heads, "patch"), "--sender": (args.sender, "path-patch"),
            "--receivers": (args.receivers, "path-patch")}
    for flag, (value, wanted) in used.items():
        if value is not None and analysis not in wanted.split(" | "):
            raise CliError(msg("cli.lens_flag_for", flag=flag, analysis=wanted, got=analysis))
    if analysis in _PATCHING and args.corrupted is None:
        raise CliError(msg("cli.lens_needs_corrupted", analysis=analysis))
    needed = {"patch": (("--heads", args.heads, "1.3,2.1"),),
              "path-patch": (("--sender", args.sender, "1.2"),
                             ("--receivers", args.receivers, "2.1,2.4"))}
    for flag, value, example in needed.get(analysis, ()):
        if value is None:
            raise CliError(msg("cli.lens_flag_needed", flag=flag, analysis=analysis,
                               example=example))


def parse_heads(text: str, flag: str, L: int, H: int, *, example: str = "1.3,2.1"
                ) -> list[tuple[int, int]]:
    """``"1.3,2.1"`` (LAYER.HEAD from 1) -> [(0, 2), (1, 0)] (0-based), checked."""
    heads = []
    items = text.replace(",", " ").split()
    for item in items:
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdigit() and head.isdigit()
                and 1 <= int(layer) <= L and 1 <= int(head) <= H):
            raise CliError(msg("cli.lens_head_spec", flag=flag, layers=L, heads=H,
                               example=example, got=repr(item)))
        heads.append((int(layer) - 1, int(head) - 1))
    if not heads:
        raise CliError(msg("cli.lens_head_spec", flag=flag, layers=L, heads=H,
                           example=example, got=repr(text)))
    return heads


def _patching(args: argparse.Namespace, model: Any, tokenizer: Any, ids: Any, corrupted: Any,
              shape: tuple[int, int], table_text: Callable[..., str]) -> dict[str, Any]:
    """patch, patch-sweep or path-patch: the answer's log-probability at the last
    position in TEXT's run, the corrupted run and the patched run(s)."""
    import torch

    from ..lens.hf_lens import patch, patch_sweep, path_patch

    zh = args.lang == "zh"
    L, H = shape
    clean, dirty = {"input_ids": ids}, {"input_ids": corrupted}
    with torch.no_grad():
        clean_logits = model(input_ids=ids).logits[0, -1]  # (V,)
        answer = int(clean_logits.argmax())

        def measure(output: Any) -> Any:  # log p(answer) at the last position
            return torch.log_softmax(output.logits[0, -1].float(), dim=-1)[answer]

        clean_value = float(torch.log_softmax(clean_logits.float(), dim=-1)[answer])
        dirty_value = float(measure(model(input_ids=corrupted)))
    token = tokenizer.convert_ids_to_tokens(answer)
    print(f"最后一个位置上 log p({token!r})：TEXT {clean_value:.4f}，--corrupted "
          f"{dirty_value:.4f}" if zh else
          f"log p({token!r}) at the last position: TEXT {clean_value:.4f}, --corrupted "
          f"{dirty_value:.4f}")
    found: dict[str, Any] = {"answer": token, "answer_id": answer,
                             "clean_logprob": clean_value, "corrupted_logprob": dirty_value}
    if args.analysis == "patch-sweep":
        with torch.no_grad():
            sweep = patch_sweep(model, clean, dirty, measure)  # (L, H)
        print("每个头单独修补后它的变化（修补后 − 被破坏）：" if zh
              else "its change when each head alone is patched (patched - corrupted):")
        print(table_text(sweep - dirty_value, args.lang, scale=1.0))
        found["patched_logprob"] = sweep.round(8).tolist()
        return found
    if args.analysis == "patch":
        heads = parse_heads(args.heads, "--heads", L, H)
        with torch.no_grad():
            patched = float(measure(patch(model, clean, dirty, heads=heads)))
        found["heads"] = [[layer + 1, head + 1] for layer, head in heads]
    else:
        (sender,) = parse_heads(args.sender, "--sender", L, H, example="1.2")
        receivers = parse_heads(args.receivers, "--receivers", L, H, example="2.1,2.4")
        early = [(layer, head) for layer, head in receivers if layer <= sender[0]]
        if early:
            raise CliError(msg("cli.lens_receivers_after", layer=sender[0] + 1,
                               got=f"{early[0][0] + 1}.{early[0][1] + 1}"))
        with torch.no_grad():
            patched = float(measure(path_patch(model, clean, dirty, sender=sender,
                                               receivers=receivers)))
        found["sender"] = [sender[0] + 1, sender[1] + 1]
        found["receivers"] = [[layer + 1, head + 1] for layer, head in receivers]
    gap = clean_value - dirty_value
    restored = (patched - dirty_value) / gap if gap != 0 else None
    share = "" if restored is None else (f"，恢复了差距的 {restored:.1%}" if zh
                                         else f", {restored:.1%} of the gap restored")
    print(f"修补后：{patched:.4f}{share}" if zh else f"patched: {patched:.4f}{share}")
    found["patched_logprob"] = patched
    found["restored"] = restored
    return found


def _attribution(model: Any, tokenizer: Any, ids: Any, zh: bool,
                 table_text: Callable[..., str]) -> dict[str, Any]:
    """dla: each head's direct contribution to the top token's logit, last position."""
    from ..lens.hf_lens import direct_logit_attribution

    scores, token = direct_logit_attribution(model, input_ids=ids)  # (L, H)
    name = tokenizer.convert_ids_to_tokens(token)
    print(f"每个头对最后一个位置上 {name!r} 的 logit 的直接贡献：" if zh
          else f"each head's direct contribution to the logit of {name!r} at the last "
               "position:")
    print(table_text(scores, "zh" if zh else "en", scale=1.0))
    return {"token": name, "token_id": token, "direct_logit_attribution":
            scores.round(8).tolist()}


def _overview(args: argparse.Namespace, loaded: Any, ids: Any,
              table_text: Callable[..., str]) -> dict[str, Any]:
    """Ablation, importance, logit lens and detectors on TEXT."""
    import torch

    from ..lens.hf_lens import (
        ablation_effects,
        head_importance,
        logit_lens,
        repeated_tokens_scores,
    )

    zh = args.lang == "zh"
    model, tokenizer = loaded.model, loaded.tokenizer

    def measure(output: Any) -> Any:  # mean log-probability of each next token
        logprobs = torch.log_softmax(output.logits[0, :-1].float(), dim=-1)  # (T-1, V)
        return logprobs.gather(1, ids[0, 1:, None]).mean()

    L, H = loaded.num_layers, loaded.num_heads
    with torch.no_grad():
        base = float(measure(model(input_ids=ids)))
    drop = ablation_effects(model, measure, how=args.how, input_ids=ids)  # (L, H)
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
    return {
        "how": args.how, "mean_next_token_logprob": base,
        "ablation_drop": drop.round(8).tolist(), "importance": importance.round(8).tolist(),
        "logit_lens_top": top,
        "detectors": {name: scores.round(6).tolist() for name, scores in detectors.items()},
    }
