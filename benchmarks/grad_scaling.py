"""Does 1/√d_k keep attention's gradients healthy? Seed 000's claim, measured.

For each head dim d_k, draw unit-variance q, k (and v, and an upstream gradient
G) with a fixed seed, run attention with scale = 1/√d_k and with scale = 1, and
measure, over every query row of every trial:

- the softmax saturation: the mean largest attention weight (1/S is uniform,
  1.0 is one-hot), and the share of rows whose largest weight exceeds 0.99;
- the norm of ∂L/∂z, the gradient at the softmax input z = scale · q kᵀ (the
  "scores" the softmax sees), and of ∂L/∂q, for the loss L = Σ out ⊙ G;
- the share of rows whose ∂L/∂z is below attnlab's vanishing threshold (1e-7).

The gradients come from attnlab's hand-written backward (attnlab.nn.backward.sdpa_backward);
∂L/∂z is read as the gradient of a zero additive bias, which enters exactly at z.
Dv is fixed (64) so that the upstream gradient reaching the weights has the same
size for every d_k and only the softmax's response changes.

Why it matters: q·k is a sum of d_k unit-variance products, so its std grows like
√d_k. Unscaled, the softmax saturates as d_k grows and its Jacobian
diag(p) − p pᵀ goes to 0, so the gradient to q and k vanishes; scaled by 1/√d_k,
the scores keep unit variance at every d_k.

Usage::

    python benchmarks/grad_scaling.py --out grad-scaling
    # writes grad-scaling/grad_scaling.{csv,json,png} and prints the table
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

try:
    import attnlab
except ImportError:  # running from a checkout without installing: use ./src
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import attnlab

from attnlab.backward import sdpa_backward
from attnlab.lens.grad_diagnostics import DEFAULT_VANISH_BELOW

VALUE_DIM = 64
COLUMNS = [
    "d_k", "scaling", "logit_std", "mean_max_weight", "frac_saturated",
    "dlogits_median", "dlogits_mean", "dq_median", "frac_vanishing",
]


def measure(d_k: int, scaled: bool, *, trials: int, length: int, seed: int) -> dict[str, Any]:
    """One row of the table: statistics over trials × length query rows."""
    rng = np.random.default_rng([seed, d_k])  # the same draws for scaled and unscaled
    q = rng.standard_normal((trials, length, d_k))  # (B, T, D)
    k = rng.standard_normal((trials, length, d_k))  # (B, S, D)
    v = rng.standard_normal((trials, length, VALUE_DIM))  # (B, S, Dv)
    upstream = rng.standard_normal((trials, length, VALUE_DIM))  # (B, T, Dv) = ∂L/∂out
    scale = 1.0 / np.sqrt(d_k) if scaled else 1.0
    logits = (q @ np.swapaxes(k, -1, -2)) * scale  # (B, T, S)
    weights = attnlab.softmax(logits)  # (B, T, S)
    zero_bias = np.zeros((trials, length, length))  # (B, T, S): ∂L/∂bias = ∂L/∂z
    dq_full, _, _, dz = sdpa_backward(q, k, v, upstream, bias=zero_bias, scale=scale)
    if dz is None:  # only for the type checker: a bias was given, so its gradient is returned
        raise RuntimeError("sdpa_backward returned no bias gradient")
    dlogits = np.linalg.norm(dz, axis=-1).ravel()  # (B*T,) per query row
    dq = np.linalg.norm(dq_full, axis=-1).ravel()  # (B*T,)
    max_weight = weights.max(axis=-1).ravel()  # (B*T,)
    return {
        "d_k": d_k,
        "scaling": "1/sqrt(d_k)" if scaled else "none",
        "logit_std": float(logits.std()),
        "mean_max_weight": float(max_weight.mean()),
        "frac_saturated": float(np.mean(max_weight > 0.99)),
        "dlogits_median": float(np.median(dlogits)),
        "dlogits_mean": float(dlogits.mean()),
        "dq_median": float(np.median(dq)),
        "frac_vanishing": float(np.mean(dlogits < DEFAULT_VANISH_BELOW)),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    header = (
        f"{'d_k':>5}  {'scaling':<11}  {'std(z)':>7}  {'max w':>6}  {'>0.99':>6}  "
        f"{'|dL/dz| med':>11}  {'|dL/dz| mean':>12}  {'|dL/dq| med':>11}  {'<1e-7':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['d_k']:>5}  {r['scaling']:<11}  {r['logit_std']:7.2f}  "
            f"{r['mean_max_weight']:6.3f}  {r['frac_saturated']:6.1%}  "
            f"{r['dlogits_median']:11.3e}  {r['dlogits_mean']:12.3e}  "
            f"{r['dq_median']:11.3e}  {r['frac_vanishing']:6.1%}"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Three panels against d_k (log axis): saturation, |∂L/∂z|, |∂L/∂q|."""
    from attnlab.report.figures import new_figure, save_figure

    fig = new_figure((13, 3.8), feature="The grad_scaling plot")
    panels = [
        ("mean_max_weight", "mean largest weight", "softmax saturation", False),
        ("dlogits_median", "median ‖∂L/∂z‖ per row", "gradient at the softmax input", True),
        ("dq_median", "median ‖∂L/∂q‖ per row", "gradient reaching q", True),
    ]
    for ax, (key, ylabel, title, log_y) in zip(fig.subplots(1, 3), panels, strict=True):
        for scaling, style in (("1/sqrt(d_k)", "o-"), ("none", "s--")):
            points = [(r["d_k"], r[key]) for r in rows if r["scaling"] == scaling]
            xs, ys = zip(*points, strict=True)
            label = "scaled by 1/√d_k" if scaling != "none" else "unscaled"
            ax.plot(xs, np.maximum(ys, 1e-300) if log_y else ys, style, label=label)
        ax.set_xscale("log", base=2)
        if log_y:
            ax.set_yscale("log")
            ax.axhline(DEFAULT_VANISH_BELOW, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("d_k")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend()
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("grad-scaling"), help="output folder")
    parser.add_argument("--dims", default="4,16,64,256,1024", help="comma-separated d_k values")
    parser.add_argument("--trials", type=int, default=64, help="independent draws per d_k")
    parser.add_argument("--length", type=int, default=64, help="T = S, tokens per draw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    args = parser.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",")]

    rows = [
        measure(d_k, scaled, trials=args.trials, length=args.length, seed=args.seed)
        for d_k in dims
        for scaled in (True, False)
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {
        "trials": args.trials, "T": args.length, "S": args.length, "Dv": VALUE_DIM,
        "seed": args.seed, "loss": "sum(out * G), G ~ N(0, 1)",
        "q, k, v": "i.i.d. N(0, 1)", "vanish_below": DEFAULT_VANISH_BELOW,
    }
    (args.out / "grad_scaling.json").write_text(
        json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n"
    )
    with open(args.out / "grad_scaling.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(
        f"trials={args.trials}  T=S={args.length}  Dv={VALUE_DIM}  seed={args.seed}  "
        "q, k, v ~ N(0, 1);  z = scale * q k^T;  L = sum(out * G)"
    )
    print(format_table(rows))
    written = [args.out / "grad_scaling.json", args.out / "grad_scaling.csv"]
    if not args.no_plot:
        try:
            written.append(plot(rows, args.out / "grad_scaling.png"))
        except ImportError:
            print("matplotlib is not installed: no plot (pip install 'attnlab[viz]')")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
