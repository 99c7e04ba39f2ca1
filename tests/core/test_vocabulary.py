"""One vocabulary across the NumPy core: every public attention function and class says
``is_causal``, ``mask``, ``key_padding``, ``scale``, ``num_heads``, ``return_weights``,
``norm``, ``window`` — never a synonym. (The torch twin is compared with the NumPy
core parameter by parameter in tests/torch/test_twins.py.)

Across layers, one name per idea: the positional encoding a model or ``explain`` adds
is ``pos`` (``positions`` are token indices: ``apply_rope(positions=)``), a model's
sizes and options are its ``DecoderConfig``, and ``seed`` is a random seed (the seed
articles' two multi-head layouts are ``split="per_head" | "fused"``). The command
line says the same: ``--pos``, ``--seed``.
"""

from __future__ import annotations

import inspect

import pytest

import attnlab
import attnlab.fast
import attnlab.nn

#: A synonym that crept in -> the one name attnlab uses for it.
SYNONYMS = {
    "causal": "is_causal",
    "need_weights": "return_weights",
    "return_attention": "return_weights",
    "output_attentions": "return_weights",
    "norm_first": "norm",
    "attn_mask": "mask",
    "key_padding_mask": "key_padding",
    "padding": "key_padding",
    "h": "num_heads",
    "n_heads": "num_heads",
    "nhead": "num_heads",
    "heads": "num_heads",
    "window_size": "window",
    "local_window_size": "window",
    "softmax_scale": "scale",
    "sm_scale": "scale",
    "d_k": "head_dim",
    "logit_softcapping": "softcap",
    "attn_logit_softcapping": "softcap",
    "causal_upper_left": "causal_alignment",
    "positional_encoding": "pos",
    "pos_encoding": "pos",
    "position_embedding_type": "pos",
}

#: Command-line options that name an idea attnlab spells otherwise (a former name may
#: stay as a hidden alias, out of the help).
CLI_SYNONYMS = {
    "--positions": "--pos",
    "--positional": "--pos",
    "--rope": "--pos",
    "--random-seed": "--seed",
}

#: Names kept on purpose, with the reason.
ALLOWED = {
    # explain(d_k=...) is seed 000's own name for the projection width it teaches.
    ("explain", "d_k"),
    # init_qkv(d_model, d_q, d_k, d_v) builds seed 000's Wq, Wk, Wv of widths d_q, d_k, d_v.
    ("init_qkv", "d_k"),
    # Recorder(heads=[0, 3]) is the list of heads to keep, not a count of heads.
    ("Recorder", "heads"),
}


def _public_callables():
    seen = {}
    for module in (attnlab, attnlab.fast, attnlab.nn):
        for name in getattr(module, "__all__", dir(module)):
            obj = getattr(module, name, None)
            if obj is None or name.startswith("_") or inspect.ismodule(obj):
                continue
            if inspect.isclass(obj):
                if issubclass(obj, Exception):
                    continue
                # Methods written in attnlab, inherited ones too (the caches' attend is
                # their shared bookkeeping's).
                own = [vars(base) for base in obj.__mro__ if base.__module__.startswith("attnlab")]
                for method in ("__init__", "__call__", "init", "attend", "append", "forward"):
                    if any(method in names for names in own):
                        seen[f"{name}.{method}"] = getattr(obj, method)
            elif callable(obj):
                seen[name] = obj
    return seen


CALLABLES = _public_callables()


def test_the_public_api_is_found():
    # A guard against a collection that silently finds nothing.
    for expected in ("scaled_dot_product_attention", "flash_attention", "MultiHeadAttention.init",
                     "MultiHeadAttention.__call__", "sliding_window_attention", "KVCache.attend",
                     "EncoderBlock.__init__", "explain"):
        assert expected in CALLABLES


@pytest.mark.parametrize("label", sorted(CALLABLES))
def test_one_name_per_concept(label):
    params = inspect.signature(CALLABLES[label]).parameters
    wrong = {
        p: SYNONYMS[p] for p in params
        if p in SYNONYMS and (label.split(".")[0], p) not in ALLOWED
    }
    assert not wrong, f"{label}: rename {wrong}"
    # `positions` are token indices; the kind of positional encoding is `pos`.
    if "positions" in params:
        assert not isinstance(params["positions"].default, str), (
            f"{label}: `positions` names an encoding here; call it pos"
        )
    # `bias` is the additive score bias of a call, never a has-bias flag.
    if "bias" in params:
        assert not isinstance(params["bias"].default, bool), (
            f"{label}: `bias` is a flag here; call it use_bias"
        )


@pytest.mark.parametrize("label", sorted(
    name for name, fn in CALLABLES.items()
    if {"mask", "is_causal"} <= set(inspect.signature(fn).parameters)
))
def test_mask_and_causal_are_spelled_and_ordered_alike(label):
    # Where a function takes a mask and is_causal, is_causal is keyword-only
    # (a positional True would read as a mask).
    params = inspect.signature(CALLABLES[label]).parameters
    assert params["is_causal"].kind is inspect.Parameter.KEYWORD_ONLY, label


def _model_configs():
    from attnlab.nn.decoder import DecoderConfig

    configs: list[type] = [DecoderConfig]
    try:
        import attnlab.train.model as train_model
    except ImportError:  # no torch: the NumPy decoder's config alone
        return configs
    return [*configs, train_model.DecoderConfig]


@pytest.mark.parametrize("config", _model_configs(), ids=lambda c: c.__module__)
def test_a_models_positional_encoding_is_pos(config):
    import dataclasses

    fields = {f.name for f in dataclasses.fields(config)}
    assert "pos" in fields and not fields & {"positions", "rope"}, (
        f"{config.__module__}.{config.__name__}: the positional encoding is `pos`")


def test_seed_is_only_a_random_seed_in_explain():
    from attnlab.lens.explain import SPLITS

    assert not [s for s in SPLITS if s.startswith("seed")], SPLITS
    assert "seed" in inspect.signature(attnlab.explain).parameters


def _commands():
    import argparse

    from attnlab.cli.app import _build_parser

    parser = _build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


@pytest.mark.parametrize("command", sorted(_commands()))
def test_the_command_line_says_the_same_names(command):
    import argparse

    actions = _commands()[command]._actions
    shown = [a for a in actions if a.help is not argparse.SUPPRESS]
    options = {flag for a in shown for flag in a.option_strings}
    wrong = {flag: CLI_SYNONYMS[flag] for flag in options if flag in CLI_SYNONYMS}
    assert not wrong, f"attnlab {command}: rename {wrong}"
    if "--seed" in options:  # --seed is the random seed: no option value says "seed..."
        seeds = [(a.option_strings[0], c) for a in shown for c in (a.choices or ())
                 if isinstance(c, str) and c.startswith("seed")]
        assert not seeds, f"attnlab {command}: {seeds} read like --seed; name them otherwise"


def test_former_names_still_work_and_warn():
    from attnlab.nn.decoder import DecoderConfig

    with pytest.warns(DeprecationWarning, match="split='fused'"):
        old = attnlab.explain(num_heads=2, split="seed001", seed=1)
    new = attnlab.explain(num_heads=2, split="fused", seed=1)
    assert old.meta["split"] == "fused" and (old.output == new.output).all()
    with pytest.warns(DeprecationWarning, match="pos='rope' or pos='none'"):
        config = DecoderConfig(rope=False)
    assert config.pos == "none"
