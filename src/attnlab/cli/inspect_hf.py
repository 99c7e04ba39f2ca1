"""``attnlab inspect --model PATH`` for any Hugging Face model, encoder or decoder.

    attnlab inspect --model ./my-llama "The cat sat on the mat." --generate 8
    attnlab inspect --model ./my-gpt2 "The cat sat." --pair "It was warm." --find "cat->sat"

The model runs with its own tokenizer through transformers, its attention read by
:mod:`attnlab.lens.hf_runs` (the model on attnlab's registered attention, its hook
points q, k, v and the pattern read with ``run_with_cache``). The outputs are those
of MiniLM's inspect (grid.png, head.png, view.html, diagnostics.json and the printed
tables); the page adds what a decoder needs: hatched not-allowed cells, prompt and
generated tokens apart with a step slider, grouped heads (GQA), the neuron view and
the norms view; with --ablation, the head table holds how much the output changes when
each head alone is zeroed. Code in the model folder never runs unless --trust-remote-code is
given.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from ..messages import msg
from .args import CliError, prepare_out_dir, text_argument


def run_transformers(args: argparse.Namespace) -> int:
    from .. import hf as attnlab_hf
    from ..errors import AttnlabError
    from ..lens.find import parse_link
    from ..lens.hf_runs import load_hf, run_hf
    from ..models.loading import minilm_path
    from .inspect_report import DEFAULT_FIND, DEFAULT_TEXTS, report, select_indices

    zh = args.lang == "zh"
    default_text = args.text is None
    text = DEFAULT_TEXTS[args.lang] if default_text else text_argument(args.text, "text")
    if not text.strip():
        raise CliError(msg("cli.text_empty", flag="text"))
    pair = None if args.pair is None else text_argument(args.pair, "--pair")
    if pair is not None and not pair.strip():
        raise CliError(msg("cli.text_empty", flag="--pair"))
    if args.generate < 0:
        raise CliError(msg("cli.generate_count", got=args.generate))
    if args.generate and pair is not None:
        raise CliError(msg("cli.generate_or_pair"))
    if args.max_length is not None and args.max_length < 1:
        raise CliError(msg("cli.max_length", got=args.max_length))
    # MiniLM's default link is only known to be in MiniLM's own tokens.
    link_text = args.find if args.find is not None else (
        DEFAULT_FIND[args.lang] if default_text and args.model is None else None)
    link = None
    if link_text is not None:
        try:
            link = parse_link(text_argument(link_text, "--find"), "--find")
        except AttnlabError as exc:
            raise CliError(exc.message or str(exc)) from None
    out = prepare_out_dir(args.out)
    _quiet_transformers()
    attnlab_hf.register()  # attn_implementation="attnlab": the hook points run_hf reads
    try:
        hf = load_hf(args.model if args.model is not None else str(minilm_path()),
                     trust_remote_code=args.trust_remote_code, max_length=args.max_length,
                     label=None if args.model is not None else "all-MiniLM-L6-v2")
        run = run_hf(hf, text, pair=pair, generate=args.generate, ablation=args.ablation)
    except AttnlabError as exc:
        # The library names its arguments (model, generate); the command line its flags.
        message = exc.message
        if message is not None and message.params.get("name") in ("model", "generate"):
            flag = "--" + message.params["name"]
            raise CliError(msg(message.key, **{**message.params, "name": flag})) from None
        raise
    L, H = run.weights.shape[:2]
    layers = select_indices(args.layer, L, "--layer")
    heads = select_indices(args.head, H, "--head")
    weights = run.weights[np.ix_(layers, heads)]  # (L', H', T, T)
    T = weights.shape[-1]
    allowed = np.tril(np.ones((T, T), dtype=bool)) if run.is_causal else None
    Hkv = run.k.shape[1]
    options = {
        "allowed": allowed,
        "prompt_length": run.prompt_length if args.generate else None,
        "heads_per_kv": H // Hkv,
        "segments": run.segments,
        # the neuron view, where the scores are q·k × one scale per layer
        "queries": None if run.scales is None else run.q[np.ix_(layers, heads)],
        "keys": None if run.scales is None else run.k[layers],
        "scales": None if run.scales is None else run.scales[layers],
        "value_norms": run.value_norms[np.ix_(layers, heads)],
        # the head table: how much the output changes when each head is zeroed
        "importance": None if run.ablation is None else run.ablation[np.ix_(layers, heads)],
    }
    if args.generate:
        pieces = hf.tokenizer.decode(run.generated.tolist())
        print(f"生成的 {args.generate} 个词元：{pieces}" if zh
              else f"generated {args.generate} tokens: {pieces}", file=sys.stderr)
    if run.neuron_note is not None:
        print(run.neuron_note.render(args.lang), file=sys.stderr)
    if not run.is_causal and run.prompt_length == hf.tokenizer.model_max_length:
        print("注意：文本被截断到模型的最大长度" if zh
              else "note: the text was cut at the model's maximum length", file=sys.stderr)
    kind = ("解码器" if zh else "decoder") if run.is_causal else ("编码器" if zh else "encoder")
    return report(args, out, weights, run.tokens, layers, heads,
                  where=f"{hf.name} ({kind}): {text}" + (f" | {pair}" if pair else ""),
                  link=link, rollout_ok=(len(layers), len(heads)) == (L, H),
                  allowed=allowed, view_options={k: v for k, v in options.items()
                                                 if v is not None})


def _quiet_transformers() -> None:
    """No progress bars or warnings from transformers on the command line's output."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
