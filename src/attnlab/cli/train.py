"""``attnlab train TASK``: train a small decoder on a synthetic task and watch its heads.

    attnlab train sort --out sort/                 # exact match on 5000 held-out lists
    attnlab train induction --out ind/             # a previous-token head, then an induction head
    attnlab train reverse --pos none --steps 500 --lang zh

Writes into --out: metrics.json, attention.npz (weights (L, H, T, T) of the first
held-out example at the last step, its tokens, and for induction the period),
training.png (loss and head scores against steps) and view.html (the attention at
every snapshot behind a slider). The progress bar goes to stderr.

``attnlab train --study scaling|norm|positions`` measures one of the seeds' training
claims instead (see :mod:`attnlab.studies.training`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from ..errors import MissingExtraError
from ..messages import msg, render
from .args import CliError, prepare_out_dir

TASKS = ("sort", "reverse", "copy", "induction", "modadd")
STUDIES = ("scaling", "norm", "positions")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train a small decoder on a synthetic task and watch its heads form",
        description="Train a small causal decoder (attnlab.torch blocks) on sort, reverse, "
        "copy, induction ([x][x] repeated random tokens) or modular addition; write the "
        "metrics, the attention at the last step, a plot and a page with a slider over "
        "training steps. Same seed, same numbers.",
    )
    p.add_argument("task", nargs="?", choices=TASKS, help="the task to train on")
    p.add_argument("--steps", type=int, help="optimizer steps (default: per task)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, batches, split "
                   "(default 0)")
    p.add_argument("--layers", type=int, help="decoder blocks (default 2; modadd 1)")
    p.add_argument("--heads", type=int, help="heads per layer (default 4)")
    p.add_argument("--d-model", type=int, dest="d_model", help="model width E (default 64)")
    p.add_argument("--head-dim", type=int, dest="head_dim", help="head dim D (default E/H)")
    p.add_argument("--attn-only", action=argparse.BooleanOptionalAction, default=None,
                   dest="attn_only", help="attention-only blocks, no MLP (default: induction "
                   "only)")
    p.add_argument("--pos", choices=["learned", "sinusoidal", "rope", "none"],
                   help="positional encoding (default learned; induction rope)")
    # The former name of --pos, still read (hidden from the help).
    p.add_argument("--positions", choices=["learned", "sinusoidal", "rope", "none"],
                   dest="pos", help=argparse.SUPPRESS)
    p.add_argument("--norm", choices=["pre", "post"], default="pre",
                   help="LayerNorm placement (default pre)")
    p.add_argument("--no-scale", action="store_true", dest="no_scale",
                   help="train without the 1/sqrt(d_k) scaling")
    p.add_argument("--lr", type=float, help="peak learning rate (default per task)")
    p.add_argument("--batch", type=int, help="examples per step (default per task)")
    p.add_argument("--warmup", type=int, help="linear warm-up steps (default per task)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--study", choices=STUDIES,
                   help="instead of one run: measure a training claim (scaling: 1/sqrt(d_k) "
                   "at d_k 16/64/256; norm: Pre-LN vs Post-LN at 2/6/12 layers with and "
                   "without warm-up; positions: none/sinusoidal/RoPE on reverse)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per setting in a --study "
                   "(default 3)")
    p.add_argument("--out", metavar="DIR", default="attnlab-train",
                   help="where to write the files (default attnlab-train/)")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the output")


class _Progress:
    """A progress bar on stderr: redrawn in place on a terminal, every 10 % otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.last_draw = 0.0
        self.last_tenth = -1

    def __call__(self, step: int, steps: int, loss: float) -> None:
        now = time.perf_counter()
        tenth = step * 10 // steps
        if self.tty:
            if now - self.last_draw < 0.1 and step < steps:
                return
            self.last_draw = now
        elif tenth == self.last_tenth:
            return
        self.last_tenth = tenth
        filled = step * 30 // steps
        bar = "#" * filled + "." * (30 - filled)
        shown = f" loss {loss:.4f}" if math.isfinite(loss) else ""
        line = f"{self.label} [{bar}] {step}/{steps}{shown} {now - self.start:.0f}s"
        if self.tty:
            end = "\n" if step == steps else ""
            print(f"\r{line}", end=end, file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)


def _positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise CliError(msg("cli.positive", flag=flag, got=value))


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--steps", args.steps), ("--layers", args.layers),
                        ("--heads", args.heads), ("--d-model", args.d_model),
                        ("--head-dim", args.head_dim), ("--batch", args.batch),
                        ("--threads", args.threads), ("--seeds", args.seeds)):
        _positive(value, flag)
    if args.seed < 0:
        raise CliError(msg("check.integer_at_least", name="--seed", low=0, got=args.seed))
    if args.study is None and args.task is None:
        raise CliError(msg("cli.task_needed", tasks=", ".join(TASKS)))
    if args.study is not None and args.task is not None:
        raise CliError(msg("cli.task_or_study"))
    out = prepare_out_dir(args.out)

    try:
        import torch
    except ImportError:
        raise MissingExtraError(msg("train.needs_torch")) from None

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.study is not None:
        return _run_study(args, out)

    from ..report import save_figure
    from ..report.training import plot_training, training_html
    from ..train import DecoderConfig, TrainConfig, ablation_check, defaults_for, train
    from ..train.tasks import make_task

    zh = args.lang == "zh"
    chosen = defaults_for(args.task)
    model_options, train_options = chosen["model"], chosen["train"]
    for key, value in (("num_layers", args.layers), ("num_heads", args.heads),
                       ("d_model", args.d_model), ("head_dim", args.head_dim),
                       ("attn_only", args.attn_only), ("pos", args.pos)):
        if value is not None:
            model_options[key] = value
    model_options.update(norm=args.norm, scale=not args.no_scale)
    for key, value in (("steps", args.steps), ("lr", args.lr), ("batch_size", args.batch),
                       ("warmup", args.warmup)):
        if value is not None:
            train_options[key] = value
    train_options["seed"] = args.seed
    task = make_task(args.task, seed=args.seed)
    model_config = DecoderConfig(task.vocab_size, task.seq_len, **model_options)
    config = TrainConfig(**train_options)
    print(("任务 " if zh else "task ") + task.describe(), file=sys.stderr)
    result = train(task, model_config, config,
                   on_step=_Progress("训练" if zh else "training"))
    metrics = result.metrics()
    metrics["threads"] = torch.get_num_threads()
    if task.period is not None and result.diverged_at is None:
        metrics["ablation"] = ablation_check(result)

    written = []
    path = out / "metrics.json"
    path.write_text(json.dumps(metrics, ensure_ascii=False, indent=2, allow_nan=False) + "\n",
                    encoding="utf-8")
    written.append(path)
    if result.diverged_at is not None:  # one line, the metrics kept; no plots of a broken run
        last = result.losses[-1] if len(result.losses) else math.nan
        what = (msg("train.weights_nonfinite") if math.isfinite(last)
                else msg("train.loss_nonfinite", loss=last))
        params = {"step": result.diverged_at, "what": what, "lr": config.lr, "path": path,
                  "last_step": metrics["last_finite_step"]}
        if params["last_step"] is None:
            raise CliError(msg("train.diverged_nowhere", **params))
        raise CliError(msg("train.diverged", last_loss=f"{metrics['last_finite_loss']:.4g}",
                           **params))
    import numpy as np

    path = out / "attention.npz"
    arrays: dict[str, Any] = {"weights": result.snapshots[-1].astype(np.float32),
                              "tokens": result.snapshot_tokens.astype(np.int64),
                              "steps": np.array(result.snapshot_steps)}
    if task.period is not None:
        arrays["period"] = np.array(task.period)
    np.savez(path, **arrays)
    written.append(path)
    title = (f"{task.name}: {model_config.num_layers} 层 × {model_config.num_heads} 头" if zh
             else f"{task.name}: {model_config.num_layers} layers × "
             f"{model_config.num_heads} heads")
    from ..train.trainer import GENERIC_DETECTORS_APPLY, TASK_DETECTORS

    # the plot and the page show the detectors that describe this task (all in metrics.json)
    shown = {name: history for name, history in result.head_history.items()
             if task.name in GENERIC_DETECTORS_APPLY or name in TASK_DETECTORS.get(task.name, ())}
    figure = plot_training(result.losses, result.snapshot_steps, shown,
                           phase_change_step=result.phase_change_step(),
                           heldout_loss=result.heldout_loss, title=title,
                           lang=args.lang)
    written.append(save_figure(figure, out / "training.png"))
    labels = [task.labels[int(t)] for t in result.snapshot_tokens]
    page = training_html(result.snapshots, result.snapshot_steps, labels,
                         head_history=shown, heldout_loss=result.heldout_loss,
                         period=task.period, title=title, lang=args.lang)
    path = out / "view.html"
    path.write_text(page, encoding="utf-8")
    written.append(path)

    print(_summary(metrics, zh))
    for item in written:
        print(render("cli.wrote", args.lang, path=item), file=sys.stderr)
    return 0


def _best(scores: list[list[float]], layers: range) -> tuple[int, int, float]:
    """The best (layer, head, score) among ``layers``, 1-based."""
    found = max(((layer, head, row[head]) for layer, row in enumerate(scores) if layer in layers
                 for head in range(len(row))), key=lambda item: item[2])
    return found[0] + 1, found[1] + 1, found[2]


def _summary(metrics: dict[str, Any], zh: bool) -> str:
    lines = []
    seconds, steps = metrics["seconds"], metrics["steps"]
    final = metrics["final_loss"]
    final_text = "–" if final is None else f"{final:.4f}"
    if zh:
        lines.append(f"{metrics['task']}：{steps} 步，{seconds:.1f} 秒，最终训练损失 {final_text}")
    else:
        lines.append(f"{metrics['task']}: {steps} steps in {seconds:.1f} s, final training "
                     f"loss {final_text}")
    if metrics["diverged_at"] is not None:
        lines.append(f"损失在第 {metrics['diverged_at']} 步发散" if zh
                     else f"the loss diverged at step {metrics['diverged_at']}")
    if "heldout_accuracy" in metrics:
        acc, n = metrics["heldout_accuracy"], metrics["heldout_examples"]
        lines.append(f"留出集完全正确率 {acc:.4f}（{n} 个样本）" if zh
                     else f"held-out exact match {acc:.4f} on {n} examples")
    else:
        first, second = metrics["first_half_loss"], metrics["second_half_loss"]
        lines.append(f"留出集损失：第一遍 {first:.3f}，重复部分 {second:.3f}" if zh
                     else f"held-out loss: first copy {first:.3f}, repeat {second:.3f}")
    names = {"previous_token": ("前一个词", "previous-token"),
             "duplicate_token": ("重复词", "duplicate-token"), "induction": ("归纳", "induction")}
    L = len(metrics["head_scores"]["induction"])
    from ..train.trainer import GENERIC_DETECTORS_APPLY

    lang = "zh" if zh else "en"
    if "next_output" in metrics["head_scores"]:
        layer, head, score = _best(metrics["head_scores"]["next_output"], range(L))
        uniform = metrics.get("next_output_uniform")
        lines.append(render("train.best_next_output", lang, layer=layer, head=head,
                            score=f"{score:.3f}",
                            uniform="–" if uniform is None else f"{uniform:.3f}"))
    for name, scores in metrics["head_scores"].items():
        if name == "next_output":
            continue
        if metrics["task"] not in GENERIC_DETECTORS_APPLY:
            lines.append(render("train.generic_not_applicable", lang, task=metrics["task"]))
            break
        layers = range(1, L) if name == "induction" and L > 1 else range(L)
        layer, head, score = _best(scores, layers)
        zh_name, en_name = names[name]
        lines.append(f"最佳{zh_name}头：第 {layer} 层第 {head} 个头，得分 {score:.3f}" if zh
                     else f"best {en_name} head: layer {layer} head {head}, score {score:.3f}")
    if "ablation" in metrics:
        lines.extend(_ablation_lines(metrics["ablation"], zh))
    if metrics.get("phase_change_step") is not None:
        step = metrics["phase_change_step"]
        lines.append(f"变化最大处：第 {step} 步附近" if zh
                     else f"largest change around step {step}")
    return "\n".join(lines)


def _ablation_lines(found: dict[str, Any], zh: bool) -> list[str]:
    def names(pairs: list[list[int]]) -> str:
        return " ".join(f"{layer + 1}·{head + 1}" for layer, head in pairs) or "-"

    def losses(values: dict[str, float | None]) -> str:
        zero, mean = (("–" if values[m] is None else f"{values[m]:.3f}") for m in ("zero",
                                                                                   "mean"))
        return f"置零 {zero}，取均值 {mean}" if zh else f"zero {zero}, mean {mean}"

    base, first = found["none"]["second_half_loss"], found["none"]["first_half_loss"]
    ind, other = found["induction_heads"], found["other_heads"]
    if zh:
        lines = [f"消融（留出集重复部分的损失；全部保留时 {base:.3f}，第一遍为 {first:.3f}）：",
                 f"  {len(ind)} 个归纳头（{names(ind)}）一起："
                 f"{losses(found['induction_heads_ablated'])}",
                 f"  其余 {len(other)} 个头（{names(other)}，不含前一个词头）一起："
                 f"{losses(found['other_heads_ablated'])}"]
    else:
        lines = [f"ablation (held-out loss on the repeat; {base:.3f} with every head, the "
                 f"first copy's {first:.3f}):",
                 f"  the {len(ind)} induction heads ({names(ind)}) together: "
                 f"{losses(found['induction_heads_ablated'])}",
                 f"  the {len(other)} other heads ({names(other)}; not the previous-token "
                 f"head) together: {losses(found['other_heads_ablated'])}"]
    for layer, row in enumerate(found["per_head"]["zero"]):
        shown = " ".join("–" if x is None else f"{x:.3f}" for x in row)
        lines.append(f"  第 {layer + 1} 层逐个置零：{shown}" if zh
                     else f"  layer {layer + 1}, one head at a time, zero: {shown}")
    return lines


def _run_study(args: argparse.Namespace, out: Any) -> int:
    from ..studies.training import run_study, study_table

    zh = args.lang == "zh"
    progress = _Progress("研究（次运行）" if zh else "study (runs)")
    results = run_study(args.study, seeds=args.seeds,
                        on_run=lambda done, total: progress(done, total, float("nan")))
    path = out / f"study-{args.study}.json"
    path.write_text(json.dumps(results, ensure_ascii=False, indent=2, allow_nan=False) + "\n",
                    encoding="utf-8")
    print(study_table(results, args.lang))
    print(render("cli.wrote", args.lang, path=path), file=sys.stderr)
    return 0
