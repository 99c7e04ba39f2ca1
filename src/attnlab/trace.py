"""A trace: the named intermediate matrices of an attention computation.

A :class:`Trace` is a list of :class:`Step` objects (X, Wq, Q, scores, weights,
...), each carrying its formula, shape and values, optionally tagged with the
head and layer it belongs to. It prints as text in English or Chinese, exports
to JSON and Markdown, and draws its attention weights as heatmaps.

``attnlab.lens.explain`` produces one; a real model's run can produce the same kind.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .errors import AttnlabError, ShapeError, check_text, make_folder, shape_str

__all__ = ["Step", "Trace", "Recorder", "STEP_TEXT"]

Lang = Literal["en", "zh"]

#: Title and one-line explanation of each step kind, in English and Chinese.
#: Every note must be true of any trace: ``explain``'s (random weights, one layer)
#: and a trained model's (learned weights, several layers).
STEP_TEXT: dict[str, dict[str, tuple[str, str]]] = {
    "X": {
        "en": ("Input X", "one row per token: its vector (an embedding, or the previous "
               "layer's output)"),
        "zh": ("输入 X", "每一行是一个词（token）的向量：词嵌入，或上一层的输出"),
    },
    "Wq": {
        "en": ("Query weights Wq", "projects each token's vector into query space "
               "(a real model learns it in training)"),
        "zh": ("查询权重 Wq", "把每个词的向量投影到查询（Query）空间（真实模型中由训练学得）"),
    },
    "Wk": {
        "en": ("Key weights Wk", "projects each token's vector into key space "
               "(a real model learns it in training)"),
        "zh": ("键权重 Wk", "把每个词的向量投影到键（Key）空间（真实模型中由训练学得）"),
    },
    "Wv": {
        "en": ("Value weights Wv", "projects each token's vector into value space "
               "(a real model learns it in training)"),
        "zh": ("值权重 Wv", "把每个词的向量投影到值（Value）空间（真实模型中由训练学得）"),
    },
    "Q": {
        "en": ("Queries Q", "what each token is looking for (like a search query)"),
        "zh": ("查询 Q", "每个词想“找”什么，相当于搜索请求"),
    },
    "K": {
        "en": ("Keys K", "what each token can be found by (like a document's index terms)"),
        "zh": ("键 K", "每个词供查询来匹配的“索引关键词”"),
    },
    "V": {
        "en": ("Values V", "the content each token passes on when it is attended to"),
        "zh": ("值 V", "每个词被关注时真正传递出去的内容"),
    },
    "scores": {
        "en": ("Scores Q·Kᵀ", "row i, column j: dot product of token i's query and "
               "token j's key, i.e. how well they match"),
        "zh": ("注意力分数 Q·Kᵀ", "第 i 行第 j 列：第 i 个词的查询与第 j 个词的键的点积，"
               "即二者的匹配程度"),
    },
    "scaled": {
        "en": ("Scaled scores", "q·k sums d_k products, so its variance grows like d_k; "
               "÷√d_k cancels that, so softmax does not saturate (saturated, it passes "
               "almost no gradient)"),
        "zh": ("缩放后的分数", "q·k 是 d_k 个乘积之和，方差随 d_k 增大；除以 √d_k 抵消这一增长，"
               "softmax 才不会饱和（饱和时几乎传不回梯度）"),
    },
    "masked": {
        "en": ("Masked scores", "blocked positions (e.g. later tokens, under a causal mask) "
               "set to -∞, so softmax gives them weight 0"),
        "zh": ("掩码后的分数", "被屏蔽的位置（如因果掩码下排在后面的词）设为 -∞，"
               "softmax 后权重为 0"),
    },
    "weights": {
        "en": ("Attention weights", "softmax of each row: every weight ≥ 0, each row sums "
               "to 1; row i is how token i divides its attention"),
        "zh": ("注意力权重", "对每一行做 softmax：权重都 ≥ 0，每行之和为 1；"
               "第 i 行就是第 i 个词的注意力分配"),
    },
    "output": {
        "en": ("Output", "row i = the rows of V summed with row i's weights "
               "(a weighted average)"),
        "zh": ("输出", "第 i 行 = 用第 i 行注意力权重对 V 的各行加权求和（即加权平均）"),
    },
    "concat": {
        "en": ("Concatenated heads", "the heads' outputs side by side, column-wise"),
        "zh": ("拼接多头输出", "把各个头的输出按列拼接在一起"),
    },
    "Wo": {
        "en": ("Output weights Wo", "mixes the concatenated heads into one output"),
        "zh": ("输出权重 Wo", "把拼接后的多头输出融合为一个输出"),
    },
    "projected": {
        "en": ("Projected output", "concat · Wo: the output of multi-head attention"),
        "zh": ("投影后的输出", "拼接结果乘以 Wo，即多头注意力的最终输出"),
    },
}

_LABELS = {
    "en": {"head": "head", "layer": "layer", "shape": "shape", "colon": ": ",
           "row_sums": "row sums", "tokens": "Tokens", "trace": "Attention trace",
           "summary": "Summary", "summary_note": "Each token → the token it attends to "
           "most (the largest weight in its row)"},
    "zh": {"head": "头", "layer": "层", "shape": "形状", "colon": "：",
           "row_sums": "每行之和", "tokens": "词", "trace": "注意力计算过程",
           "summary": "小结", "summary_note": "每个词 → 它最关注的词（该行中最大的注意力权重）"},
}

#: Which axes of a step's matrix are indexed by tokens: (rows, columns).
_TOKEN_AXES = {
    "X": ("q", None), "Q": ("q", None), "K": ("k", None), "V": ("k", None),
    "scores": ("q", "k"), "scaled": ("q", "k"), "masked": ("q", "k"),
    "weights": ("q", "k"), "output": ("q", None), "concat": ("q", None),
    "projected": ("q", None),
}


@dataclass
class Step:
    """One named intermediate: ``values`` with its ``formula``; head/layer may be None."""

    key: str
    values: np.ndarray
    formula: str
    head: int | None = None
    layer: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def title(self, lang: Lang = "en") -> str:
        return STEP_TEXT.get(self.key, {}).get(lang, (self.key, ""))[0]

    def note(self, lang: Lang = "en") -> str:
        return STEP_TEXT.get(self.key, {}).get(lang, ("", ""))[1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": {"en": self.title("en"), "zh": self.title("zh")},
            "formula": self.formula,
            "head": self.head,
            "layer": self.layer,
            "shape": list(self.shape),
            # -inf (masked) is not valid JSON: it is written as null.
            "values": _jsonable(self.values),
        }


@dataclass
class Trace:
    """The steps of one attention computation, in order.

    ``tokens`` label the query rows (and key columns, ``key_tokens`` if they differ).
    ``meta`` holds the settings (d_k, scale, heads, causal, seed, ...).
    """

    steps: list[Step]
    tokens: list[str]
    key_tokens: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def get(self, key: str, head: int | None = None, layer: int | None = None) -> Step:
        """The step named ``key`` (of ``head``/``layer`` if given)."""
        for step in self.steps:
            if step.key == key and (head is None or step.head == head) and (
                layer is None or step.layer == layer
            ):
                return step
        keys = sorted({s.key for s in self.steps})
        raise AttnlabError(
            f"key: expected one of {keys} (head={head}, layer={layer}), got {key!r}"
        )

    @property
    def heads(self) -> list[int]:
        return sorted({s.head for s in self.steps if s.head is not None})

    def weights(self, layer: int | None = None) -> np.ndarray:
        """Attention weights of every head: (H, T, S) (one head: (1, T, S))."""
        found = [s.values for s in self.steps if s.key == "weights" and (
            layer is None or s.layer == layer)]
        if not found:
            raise AttnlabError("trace: it holds no attention weights step")
        return np.stack(found)  # (H, T, S)

    def attention(self) -> np.ndarray:
        """Weights of every recorded layer and head as one (L, H, T, S) array.

        Steps without a layer tag form a single layer (an ``explain`` trace gives
        L = 1); a trace of one head gives H = 1. Every layer must hold the same heads.
        """
        found = [s for s in self.steps if s.key == "weights"]
        if not found:
            raise AttnlabError("trace: expected a trace holding 'weights' steps, found none")
        layer_ids = sorted({s.layer for s in found if s.layer is not None})
        groups = [found] if not layer_ids else [[s for s in found if s.layer == i]
                                                for i in layer_ids]
        try:
            stacked = np.stack([np.stack([s.values for s in group]) for group in groups])
        except ValueError as exc:
            raise ShapeError(
                f"trace: its weights steps differ in shape or count ({exc})"
            ) from None
        if stacked.ndim != 4:
            raise ShapeError(
                "trace: expected (T, S) weights per head, giving (L, H, T, S), got "
                f"{shape_str(stacked.shape)}"
            )
        return stacked  # (L, H, T, S)

    def view(self, *, title: str | None = None, lang: Lang = "en") -> Any:
        """The interactive viewer of these weights (a ``report.viewer.AttentionView``)."""
        from .report.viewer import AttentionView

        return AttentionView.from_trace(self, title=title, lang=lang)

    def _repr_html_(self) -> str | None:
        """In Jupyter, a trace with attention weights shows as the interactive viewer."""
        if not any(s.key == "weights" for s in self.steps):
            return None
        html: str = self.view()._repr_html_()
        return html

    @property
    def output(self) -> np.ndarray:
        """The final output of the computation (the last output-like step)."""
        for step in reversed(self.steps):
            if step.key in ("projected", "concat") or (step.key == "output" and step.head is None):
                return step.values
        return self.get("output").values

    # ---- export -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "key_tokens": self.key_tokens or self.tokens,
            "meta": _jsonable(self.meta),
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=indent)

    def to_text(self, lang: Lang = "en", *, precision: int = 4) -> str:
        """Every step with its title, formula, shape and values, as plain text.

        It ends with a summary: for each attention-weights step, the key each query
        token gives its largest weight.
        """
        _check_lang(lang)
        precision = _check_precision(precision)
        words = _LABELS[lang]
        lines = [f"== {words['trace']} ==",
                 f"{words['tokens']}{words['colon']}" + " | ".join(self.tokens)]
        for number, step in enumerate(self.steps, 1):
            lines.append("")
            lines.append(_heading(step, number, lang) + f"    {words['shape']} {step.shape}")
            lines.append(f"  {step.formula}    # {step.note(lang)}")
            row_labels, col_labels = self._axis_labels(step)
            sums = step.values.sum(axis=-1) if step.key == "weights" else None
            lines.extend("  " + row for row in _format_matrix(
                step.values, row_labels, col_labels, precision, sums, words["row_sums"]))
        summary = self._summary(lang, precision)
        if summary:
            lines += ["", f"== {words['summary']} ==",
                      "  " + words["summary_note"] + words["colon"].rstrip()]
            lines += ["  " + (f"{where}{words['colon']}" if where else "") + "   ".join(pairs)
                      for where, pairs in summary]
        return "\n".join(lines)

    def to_markdown(self, lang: Lang = "en", *, precision: int = 4) -> str:
        """The trace as a Markdown document: one section and one table per step, then
        the same summary as :meth:`to_text`."""
        _check_lang(lang)
        precision = _check_precision(precision)
        words = _LABELS[lang]
        out = [f"# {words['trace']}", "", f"**{words['tokens']}**{words['colon']}" + " · ".join(
            _md_escape(t) for t in self.tokens)]
        for number, step in enumerate(self.steps, 1):
            out += ["", f"## {_heading(step, number, lang)}", "",
                    f"`{step.formula}` — {step.note(lang)} · {words['shape']} {step.shape}", ""]
            matrix = np.atleast_2d(step.values)
            row_labels, col_labels = self._axis_labels(step)
            cols = col_labels or [str(j) for j in range(matrix.shape[1])]
            rows = row_labels or [str(i) for i in range(matrix.shape[0])]
            header = ["", *cols] + ([words["row_sums"]] if step.key == "weights" else [])
            out.append("| " + " | ".join(_md_escape(h) for h in header) + " |")
            out.append("|" + "---|" * len(header))
            for i, row in enumerate(matrix):
                cells = [_md_escape(rows[i]), *(_fmt(x, precision) for x in row)]
                if step.key == "weights":
                    cells.append(_fmt(float(row.sum()), precision))
                out.append("| " + " | ".join(cells) + " |")
        summary = self._summary(lang, precision)
        if summary:
            out += ["", f"## {words['summary']}", "",
                    words["summary_note"] + words["colon"].rstrip(), ""]
            out += ["- " + (f"{where}{words['colon']}" if where else "")
                    + " · ".join(_md_escape(p) for p in pairs) for where, pairs in summary]
        return "\n".join(out) + "\n"

    def _summary(self, lang: Lang, precision: int) -> list[tuple[str, list[str]]]:
        """Per weights step: (where, ["query → strongest key (weight)", ...])."""
        found = []
        for step in self.steps:
            if step.key != "weights":
                continue
            matrix = np.atleast_2d(step.values)  # (T, S)
            rows, cols = self._axis_labels(step)
            rows = rows or [f"#{i + 1}" for i in range(matrix.shape[0])]
            cols = cols or [f"#{j + 1}" for j in range(matrix.shape[1])]
            pairs = []
            for i, row in enumerate(matrix):
                top = float(row.max())
                if not top > 0:  # a fully blocked row attends to nothing
                    pairs.append(f"{rows[i]} → –")
                    continue
                best = "/".join(cols[j] for j in np.flatnonzero(row >= top - 1e-12))  # ties
                pairs.append(f"{rows[i]} → {best} ({_fmt(top, precision)})")
            found.append((_where(step, lang), pairs))
        return found

    def plot(self, *, lang: Lang = "en", title: str | None = None) -> Any:
        """Heatmap of the weights: one head -> a single heatmap, several -> a grid."""
        from .report import heatmaps as viz

        weights = self.weights()  # (H, T, S)
        keys = self.key_tokens or self.tokens
        if len(weights) == 1:
            if title is None:  # seed 000's heatmap title
                title = "注意力权重热图" if lang == "zh" else "Attention weights"
            return viz.plot_attention(weights[0], self.tokens, keys, title=title, lang=lang)
        return viz.plot_head_grid(weights, self.tokens, keys, title=title, lang=lang)

    def save(self, out_dir: str | Path, *, lang: Lang = "en") -> list[Path]:
        """Write heatmap.png, heatmap.svg, trace.json and trace.md into ``out_dir``."""
        from .report import heatmaps as viz

        _check_lang(lang)
        for name, labels in (("tokens", self.tokens), ("key_tokens", self.key_tokens or [])):
            for i, token in enumerate(labels):
                check_text(str(token), f"{name}[{i}]")
        folder = make_folder(out_dir, "out_dir")
        written = [folder / "trace.json", folder / "trace.md"]
        written[0].write_text(self.to_json() + "\n", encoding="utf-8")
        written[1].write_text(self.to_markdown(lang), encoding="utf-8")
        figure = self.plot(lang=lang)
        for name in ("heatmap.png", "heatmap.svg"):
            written.append(viz.save_figure(figure, folder / name))
        return written

    def _axis_labels(self, step: Step) -> tuple[list[str] | None, list[str] | None]:
        axes = _TOKEN_AXES.get(step.key, (None, None))
        by_axis = {"q": self.tokens, "k": self.key_tokens or self.tokens, None: None}
        rows, cols = by_axis[axes[0]], by_axis[axes[1]]
        values = np.atleast_2d(step.values)
        if rows is not None and len(rows) != values.shape[0]:
            rows = None
        if cols is not None and len(cols) != values.shape[1]:
            cols = None
        return rows, cols


class Recorder:
    """Collects named intermediates during a forward pass, keeping only what is asked.

    Pass one as ``recorder=`` to :class:`attnlab.MultiHeadAttention` (or a layer,
    or a model's run): it keeps the steps in ``keep`` for the ``layers`` and
    ``heads`` chosen (None = all) and for one item of the batch, so a long input
    need not hold every tensor. The model sets ``recorder.layer`` as it goes.

    Keys: "X" (layer input), "Q", "K", "V", "scores", "scaled", "weights",
    "output" (per-head outputs), "projected" (after Wo); or keep="all".
    """

    KEYS = ("X", "Q", "K", "V", "scores", "scaled", "weights", "output", "projected")

    def __init__(
        self,
        keep: str | tuple[str, ...] | list[str] = ("weights",),
        *,
        layers: list[int] | None = None,
        heads: list[int] | None = None,
        batch_index: int = 0,
    ):
        chosen = self.KEYS if keep == "all" else tuple([keep] if isinstance(keep, str) else keep)
        unknown = [k for k in chosen if k not in self.KEYS]
        if unknown:
            raise AttnlabError(
                f"keep: expected keys from {list(self.KEYS)} or 'all', got {unknown}"
            )
        self.keep = frozenset(chosen)
        self.layers = None if layers is None else set(layers)
        self.heads = None if heads is None else sorted(set(heads))
        self.batch_index = batch_index
        self.layer: int | None = None
        self.steps: list[Step] = []

    def wants(self, key: str) -> bool:
        return key in self.keep and (self.layers is None or self.layer in self.layers)

    def add(self, key: str, values: np.ndarray, formula: str) -> None:
        """Record a whole-layer tensor (B, T, X) (or (T, X) unbatched)."""
        if self.wants(key):
            item = values[self.batch_index] if values.ndim == 3 else values  # (T, X)
            self.steps.append(Step(key, np.array(item), formula, layer=self.layer))

    def add_heads(self, key: str, values: np.ndarray, formula: str) -> None:
        """Record a per-head tensor (B, H, T, X) (or (H, T, X) unbatched), head by head."""
        if not self.wants(key):
            return
        item = values[self.batch_index] if values.ndim == 4 else values  # (H, T, X)
        for h in range(item.shape[0]) if self.heads is None else self.heads:
            if h < item.shape[0]:
                self.steps.append(
                    Step(key, np.array(item[h]), formula, head=h, layer=self.layer)
                )


#: Decimals printed at most: float64 holds about 17 significant digits.
MAX_PRECISION = 17


def _check_precision(precision: Any) -> int:
    if isinstance(precision, (bool, np.bool_)) or not isinstance(precision, (int, np.integer)) \
            or not 0 <= precision <= MAX_PRECISION:
        raise AttnlabError(
            f"precision: expected an integer number of decimals in 0..{MAX_PRECISION}, "
            f"got {precision!r}"
        )
    return int(precision)


def _check_lang(lang: str) -> None:
    if lang not in _LABELS:
        raise AttnlabError(f"lang: expected 'en' or 'zh', got {lang!r}")


def _where(step: Step, lang: Lang) -> str:
    """"layer 2, head 1" / "第 2 层，第 1 个头"; "" for a step without layer or head."""
    where = []
    if lang == "en":
        if step.layer is not None:
            where.append(f"layer {step.layer + 1}")
        if step.head is not None:
            where.append(f"head {step.head + 1}")
        return ", ".join(where)
    if step.layer is not None:
        where.append(f"第 {step.layer + 1} 层")
    if step.head is not None:
        where.append(f"第 {step.head + 1} 个头")
    return "，".join(where)


def _heading(step: Step, number: int, lang: Lang) -> str:
    where = _where(step, lang)
    if lang == "en":
        return f"Step {number} · {step.title(lang)}" + (f" [{where}]" if where else "")
    return f"第 {number} 步 · {step.title(lang)}" + (f"（{where}）" if where else "")


def _fmt(x: float, precision: int) -> str:
    if np.isneginf(x):
        return "-∞"
    return f"{x:.{precision}f}"


def _width(text: str) -> int:
    """Display width in a terminal: CJK characters take two columns."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return " " * (width - _width(text)) + text


def _format_matrix(
    values: np.ndarray,
    row_labels: list[str] | None,
    col_labels: list[str] | None,
    precision: int,
    row_sums: np.ndarray | None,
    sums_label: str,
) -> list[str]:
    matrix = np.atleast_2d(values)
    cells = [[_fmt(float(x), precision) for x in row] for row in matrix]
    cols = col_labels or [""] * matrix.shape[1]
    col_w = max([_width(c) for c in cols] + [_width(c) for row in cells for c in row] + [1])
    rows = row_labels or [""] * matrix.shape[0]
    row_w = max(_width(r) for r in rows)
    lines = []
    if col_labels:
        header = " " * row_w + "  " + " ".join(_pad(c, col_w) for c in cols)
        if row_sums is not None:  # over the sums column: past "]" and three spaces
            header += "    " + sums_label
        lines.append(header)
    for i, row in enumerate(cells):
        line = _pad(rows[i], row_w) + " [" + " ".join(_pad(c, col_w) for c in row) + "]"
        if row_sums is not None:
            line += f"   {float(np.atleast_1d(row_sums)[i]):.{precision}f}"
        lines.append(line)
    return lines


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if np.issubdtype(value.dtype, np.floating):
            obj = value.astype(object)
            obj[~np.isfinite(value)] = None
            return [_jsonable(v) for v in obj] if value.ndim else obj.item()
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (np.floating, float)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value
