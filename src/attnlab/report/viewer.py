"""An interactive attention viewer: one self-contained HTML page.

:func:`render_html` turns weights ``(L, H, T, S)`` (L layers, H heads, T query length,
S key length) and their tokens into a page that opens from disk in any browser:

- choose the layer and the head (``#layer-select``, ``#head-select``);
- a BertViz-style head view: queries on the left, keys on the right
  (``.token.query[data-index=i]``, ``.token.key[data-index=j]``); hovering (or
  focusing) a query draws its lines to every key with opacity = weight, and shades the
  keys by weight; hovering a key does the same for the queries that look at it;
- a heatmap of the chosen head (``table#heatmap``, cells ``td.cell[data-row][data-col]``
  with the weight in ``data-value``); hovering a token highlights its row
  (``tr.row-highlight``) or its column (``td.col-highlight``);
- the :mod:`attnlab.lens.diagnostics` of that head and layer beside it.

Self-contained and safe by construction
---------------------------------------
- No CDN, no network, no external file: CSS and vanilla JavaScript are inline, and the
  data is embedded as JSON in ``<script type="application/json">`` with every ``<``,
  ``>`` and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026`` (so no token can
  close the script element).
- Every token is inserted with ``textContent`` (never ``innerHTML``): a token such as
  ``<img src=x onerror=alert(1)>`` is shown as text and never runs. The title is
  escaped with :func:`html.escape`.
- A Content-Security-Policy allows only the page's own script and style (by SHA-256
  hash) and no network at all, as a second line of defence.

In Jupyter, :class:`AttentionView` displays itself (``_repr_html_``) inside a sandboxed
``<iframe srcdoc>``: each view is its own document, so several views on one notebook
page share no ids, styles or scripts (each iframe also gets a unique id).

>>> import numpy as np
>>> page = render_html(np.full((1, 1, 2, 2), 0.5), ["<b>", "&"])
>>> page.startswith("<!DOCTYPE html>"), "<b>" in page
(True, False)
"""

from __future__ import annotations

import base64
import hashlib
import html
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from ..errors import AttnlabError, ShapeError, check_text, make_folder, shape_str
from ..lens.diagnostics import (
    NEAR_DUPLICATE_JS,
    NEAR_UNIFORM_ENTROPY,
    OVER_SPARSE_ENTROPY,
    OVER_SPARSE_MAX_WEIGHT,
    POSITIONAL_HEAD_SCORE,
    SINK_SHARE,
    Diagnostics,
    _check_weights,
    diagnose,
    trace_weights,
)

if TYPE_CHECKING:
    from ..trace import Trace

__all__ = ["AttentionView", "render_html"]

Lang = Literal["en", "zh"]

_DECIMALS = 4  # weights are embedded with 4 decimals: the page shows 2, tooltips 4
_ROW_PX = 22  # height of one token row in the head view (the lines are drawn to match)
_view_ids = itertools.count(1)

_WORDS: dict[str, dict[str, Any]] = {
    "en": {
        "title": "Attention viewer",
        "layer": "Layer",
        "head": "Head",
        "layer_option": "Layer {n}",
        "head_option": "Head {n}",
        "head_view": "Head view",
        "head_view_hint": "Hover a token: its lines show where it attends (opacity = weight).",
        "queries": "Query",
        "keys": "Key",
        "heatmap": "Attention weights",
        "heatmap_hint": "Row = query, column = key; each row sums to 1.",
        "diagnostics": "Diagnostics",
        "this_head": "This head",
        "this_layer": "This layer",
        "flags": "Flags",
        "no_flags": "none",
        "mean_js": "Mean JS distance between heads",
        "closest": "Closest pair",
        "duplicates": "Near-duplicate pairs",
        "to_others": "JS distance from this head to",
        "none": "–",
        "metrics": {
            "entropy": ("Normalised entropy", "mean over rows of entropy / log(number of "
                        "attendable keys): 1 = uniform, 0 = one-hot"),
            "max_weight": ("Mean max weight", "mean over rows of the largest weight"),
            "special_share": ("[CLS]/[SEP] share", "mean weight on [CLS]/[SEP] keys"),
            "previous_token": ("Previous token", "mean weight of query i on key i-1"),
            "next_token": ("Next token", "mean weight of query i on key i+1"),
            "self_token": ("Self", "mean weight of query i on key i"),
        },
        "flag_text": {
            "near_uniform": "near uniform", "over_sparse": "over-sparse",
            "sink": "sink", "previous_token": "previous-token", "next_token": "next-token",
            "self": "self",
        },
        "legend": (
            f"near uniform: entropy > {NEAR_UNIFORM_ENTROPY}; over-sparse: max weight > "
            f"{OVER_SPARSE_MAX_WEIGHT} or entropy < {OVER_SPARSE_ENTROPY}; sink: > "
            f"{SINK_SHARE} on [CLS]/[SEP]; previous-token / next-token / self: that weight > "
            f"{POSITIONAL_HEAD_SCORE}; "
            f"near-duplicate heads: JS distance < {NEAR_DUPLICATE_JS}."
        ),
    },
    "zh": {
        "title": "注意力查看器",
        "layer": "层",
        "head": "头",
        "layer_option": "第 {n} 层",
        "head_option": "第 {n} 个头",
        "head_view": "注意力连线",
        "head_view_hint": "把鼠标移到词上：连线表示它关注哪些词（越不透明，权重越大）。",
        "queries": "查询 (Query)",
        "keys": "键 (Key)",
        "heatmap": "注意力权重",
        "heatmap_hint": "行 = 查询，列 = 键；每行之和为 1。",
        "diagnostics": "诊断",
        "this_head": "当前头",
        "this_layer": "当前层",
        "flags": "提示",
        "no_flags": "无",
        "mean_js": "头之间的平均 JS 距离",
        "closest": "最相近的两个头",
        "duplicates": "近似重复的头",
        "to_others": "当前头与其他头的 JS 距离",
        "none": "–",
        "metrics": {
            "entropy": ("归一化熵", "各行熵 / log(可关注的键数) 的平均：1 = 均匀，0 = 只看一个词"),
            "max_weight": ("平均最大权重", "各行最大权重的平均"),
            "special_share": ("[CLS]/[SEP] 占比", "落在 [CLS]/[SEP] 上的平均权重"),
            "previous_token": ("前一个词", "查询 i 对键 i-1 的平均权重"),
            "next_token": ("后一个词", "查询 i 对键 i+1 的平均权重"),
            "self_token": ("自身", "查询 i 对键 i 的平均权重"),
        },
        "flag_text": {
            "near_uniform": "近似均匀", "over_sparse": "过度稀疏", "sink": "汇聚到特殊词",
            "previous_token": "关注前一个词", "next_token": "关注后一个词", "self": "关注自身",
        },
        "legend": (
            f"近似均匀：熵 > {NEAR_UNIFORM_ENTROPY}；过度稀疏：最大权重 > {OVER_SPARSE_MAX_WEIGHT} "
            f"或熵 < {OVER_SPARSE_ENTROPY}；汇聚到特殊词：[CLS]/[SEP] 占比 > {SINK_SHARE}；"
            f"关注前一个词 / 后一个词 / 自身：对应的平均权重 > {POSITIONAL_HEAD_SCORE}；"
            f"近似重复：JS 距离 < {NEAR_DUPLICATE_JS}。"
        ),
    },
}

_CSS = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI","Noto Sans CJK SC",
"PingFang SC","Microsoft YaHei",sans-serif;color:#1d2433;background:#f6f7fb}
header{display:flex;flex-wrap:wrap;align-items:center;gap:12px 24px;padding:12px 18px;
background:#fff;border-bottom:1px solid #dde1ea}
h1{font-size:18px;margin:0;font-weight:600}
h2{font-size:14px;margin:0 0 4px;font-weight:600}
h3{font-size:13px;margin:12px 0 4px;font-weight:600;color:#3b4357}
.controls{display:flex;gap:14px;align-items:center}
select{font:inherit;padding:2px 6px}
main{display:flex;flex-wrap:wrap;gap:14px;padding:14px 18px;align-items:flex-start}
.panel{background:#fff;border:1px solid #dde1ea;border-radius:8px;padding:10px 12px;
max-height:calc(100vh - 90px);overflow:auto}
.hint{font-size:12px;color:#5b6478;margin:0 0 8px}
.columns{display:flex;align-items:flex-start}
.column-title{font-size:11px;color:#5b6478;height:18px}
.token-column{display:flex;flex-direction:column}
.token{height:22px;line-height:22px;padding:0 6px;max-width:11em;overflow:hidden;
text-overflow:ellipsis;white-space:pre;border-radius:4px;cursor:default;outline:none}
.token.query{text-align:right}
.token.active{background:#ffd166 !important;font-weight:600}
.token:focus-visible{box-shadow:0 0 0 2px #3b6fd8}
#lines{display:block;margin-top:18px;flex:none}
.attn-line{stroke:#1f5fbf;stroke-linecap:round}
.attn-line.key-focus{stroke:#c8691c}
table#heatmap{border-collapse:collapse;font-size:11px}
#heatmap th{font-weight:500;padding:1px 4px;white-space:pre;max-width:6em;overflow:hidden;
text-overflow:ellipsis}
#heatmap th.query-label{text-align:right}
#heatmap td.cell{width:36px;min-width:22px;height:22px;text-align:center;
border:1px solid #fff;font-variant-numeric:tabular-nums}
#heatmap tr.row-highlight th{background:#ffd166}
#heatmap tr.row-highlight td.cell{border-top:2px solid #e4572e;border-bottom:2px solid #e4572e}
#heatmap td.col-highlight{border-left:2px solid #d9822b;border-right:2px solid #d9822b}
#heatmap th.col-highlight{background:#ffd166}
#diagnostics{min-width:260px;max-width:380px}
table.metrics{border-collapse:collapse;width:100%}
table.metrics th{text-align:left;font-weight:400;color:#3b4357;padding:2px 8px 2px 0}
table.metrics td{text-align:right;font-variant-numeric:tabular-nums;padding:2px 0}
.flag{display:inline-block;margin:2px 4px 2px 0;padding:1px 8px;border-radius:10px;
background:#fde2d8;color:#8a2b0e;font-size:12px}
.flag.none{background:#e3f4e8;color:#1d6b35}
ul.others{list-style:none;margin:0;padding:0}
ul.others li{display:flex;justify-content:space-between;padding:1px 0}
ul.others li.duplicate{color:#b3261e;font-weight:600}
.legend{font-size:11px;color:#5b6478;margin-top:12px}
"""

_JS = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attnlab-data").textContent);
  var words = data.words, diag = data.diagnostics;
  var L = data.shape[0], H = data.shape[1], T = data.shape[2], S = data.shape[3];
  var ROW = data.row_px, LINES_WIDTH = 150, ALL_LINES_LIMIT = 4096;
  var root = document.getElementById("attnlab-view");
  var layerSelect = document.getElementById("layer-select");
  var headSelect = document.getElementById("head-select");
  var svg = document.getElementById("lines");
  var table = document.getElementById("heatmap");
  var state = {layer: 0, head: 0, hover: null};

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) { node.className = className; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }
  function fmt(value, digits) {
    return value === null || value === undefined ? words.none : value.toFixed(digits);
  }
  function fill(template, n) { return template.replace("{n}", String(n)); }
  function weights() { return data.weights[state.layer][state.head]; }

  /* Colour scale close to matplotlib's YlGnBu, as in the PNG heatmaps. */
  var STOPS = [[255,255,217],[237,248,177],[199,233,180],[127,205,187],[65,182,196],
               [29,145,192],[34,94,168],[37,52,148],[8,29,88]];
  function colour(v) {
    var x = Math.max(0, Math.min(1, v)) * (STOPS.length - 1);
    var i = Math.min(STOPS.length - 2, Math.floor(x)), f = x - i;
    var c = [0, 1, 2].map(function (k) {
      return Math.round(STOPS[i][k] + f * (STOPS[i + 1][k] - STOPS[i][k]));
    });
    return "rgb(" + c.join(",") + ")";
  }

  /* ---- controls */
  function addOptions(select, count, template) {
    for (var n = 0; n < count; n++) {
      var option = el("option", "", fill(template, n + 1));
      option.value = String(n);
      select.appendChild(option);
    }
  }
  addOptions(layerSelect, L, words.layer_option);
  addOptions(headSelect, H, words.head_option);
  layerSelect.addEventListener("change", function () {
    state.layer = Number(layerSelect.value); render();
  });
  headSelect.addEventListener("change", function () {
    state.head = Number(headSelect.value); render();
  });

  /* ---- head view: token columns (text via textContent only) */
  var queryTokens = [], keyTokens = [];
  function buildColumn(id, kind, labels, store) {
    var column = document.getElementById(id);
    labels.forEach(function (label, index) {
      var token = el("div", "token " + kind, label);
      token.dataset.index = String(index);
      token.dataset.hoverKind = kind;
      token.title = label;
      token.tabIndex = 0;
      column.appendChild(token);
      store.push(token);
    });
  }
  buildColumn("query-tokens", "query", data.tokens, queryTokens);
  buildColumn("key-tokens", "key", data.key_tokens, keyTokens);
  svg.setAttribute("width", String(LINES_WIDTH));
  svg.setAttribute("height", String(Math.max(T, S) * ROW));

  function line(q, k, weight, className) {
    var node = document.createElementNS(svg.namespaceURI, "line");
    node.setAttribute("x1", "2");
    node.setAttribute("y1", String((q + 0.5) * ROW));
    node.setAttribute("x2", String(LINES_WIDTH - 2));
    node.setAttribute("y2", String((k + 0.5) * ROW));
    node.setAttribute("stroke-opacity", weight.toFixed(4));
    node.setAttribute("stroke-width", (1 + 3 * weight).toFixed(2));
    node.setAttribute("class", className);
    node.setAttribute("data-q", String(q));
    node.setAttribute("data-k", String(k));
    svg.appendChild(node);
  }
  function drawLines() {
    clear(svg);
    var w = weights(), hover = state.hover, q, k;
    if (hover === null) {
      if (T * S > ALL_LINES_LIMIT) { return; }  /* too many to read: wait for a hover */
      for (q = 0; q < T; q++) {
        for (k = 0; k < S; k++) { line(q, k, w[q][k] * 0.6, "attn-line"); }
      }
    } else if (hover.kind === "query") {
      for (k = 0; k < S; k++) { line(hover.index, k, w[hover.index][k], "attn-line focus"); }
    } else {
      for (q = 0; q < T; q++) {
        line(q, hover.index, w[q][hover.index], "attn-line focus key-focus");
      }
    }
  }

  /* ---- heatmap */
  var cells = [], rows = [], keyHeaders = [];
  (function buildHeatmap() {
    var head = el("thead"), top = el("tr");
    top.appendChild(el("th", "corner", ""));
    data.key_tokens.forEach(function (label, k) {
      var th = el("th", "key-label", label);
      th.dataset.col = String(k); th.dataset.hoverKind = "key"; th.dataset.index = String(k);
      th.title = label;
      top.appendChild(th); keyHeaders.push(th);
    });
    head.appendChild(top); table.appendChild(head);
    var body = el("tbody");
    data.tokens.forEach(function (label, q) {
      var tr = el("tr");
      tr.dataset.row = String(q);
      var th = el("th", "query-label", label);
      th.dataset.hoverKind = "query"; th.dataset.index = String(q); th.title = label;
      tr.appendChild(th);
      var rowCells = [];
      for (var k = 0; k < S; k++) {
        var td = el("td", "cell");
        td.dataset.row = String(q); td.dataset.col = String(k);
        td.dataset.hoverKind = "query"; td.dataset.index = String(q);
        tr.appendChild(td); rowCells.push(td);
      }
      body.appendChild(tr); rows.push(tr); cells.push(rowCells);
    });
    table.appendChild(body);
  })();
  var showNumbers = S <= 24;
  function paintHeatmap() {
    var w = weights();
    for (var q = 0; q < T; q++) {
      for (var k = 0; k < S; k++) {
        var value = w[q][k], td = cells[q][k];
        td.dataset.value = value.toFixed(4);
        td.textContent = showNumbers ? value.toFixed(2) : "";
        td.style.backgroundColor = colour(value);
        td.style.color = value > 0.55 ? "#fff" : "#1d2433";
        td.title = data.tokens[q] + " \u2192 " + data.key_tokens[k] + ": " + value.toFixed(4);
      }
    }
  }

  /* ---- diagnostics */
  function renderDiagnostics() {
    var box = document.getElementById("diagnostics-body");
    clear(box);
    if (!diag) { return; }
    var record = diag.heads[state.layer * H + state.head], layer = diag.layers[state.layer];
    box.appendChild(el("h3", "", words.this_head + " \u00b7 " +
      fill(words.layer_option, state.layer + 1) + " \u00b7 " +
      fill(words.head_option, state.head + 1)));
    var metrics = el("table", "metrics");
    metrics.id = "head-metrics";
    Object.keys(words.metrics).forEach(function (name) {
      var tr = el("tr"), label = words.metrics[name];
      tr.dataset.metric = name; tr.title = label[1];
      tr.appendChild(el("th", "", label[0]));
      tr.appendChild(el("td", "", fmt(record[name], 3)));
      metrics.appendChild(tr);
    });
    box.appendChild(metrics);
    box.appendChild(el("h3", "", words.flags));
    var flags = el("div", "flags");
    flags.id = "head-flags";
    record.flags.forEach(function (name) {
      var badge = el("span", "flag", words.flag_text[name] || name);
      badge.dataset.flag = name;
      flags.appendChild(badge);
    });
    if (!record.flags.length) { flags.appendChild(el("span", "flag none", words.no_flags)); }
    box.appendChild(flags);

    box.appendChild(el("h3", "", words.this_layer));
    var summary = el("table", "metrics");
    summary.id = "layer-metrics";
    function pairText(pair) {
      return fill(words.head_option, pair[0] + 1) + " ~ " + fill(words.head_option, pair[1] + 1) +
        " (" + pair[2].toFixed(3) + ")";
    }
    [[words.mean_js, fmt(layer.mean_js_distance, 3)],
     [words.closest, layer.closest_pair ? pairText(layer.closest_pair) : words.none],
     [words.duplicates, layer.near_duplicates.length ?
       layer.near_duplicates.map(pairText).join(", ") : words.none]].forEach(function (row) {
      var tr = el("tr");
      tr.appendChild(el("th", "", row[0])); tr.appendChild(el("td", "", row[1]));
      summary.appendChild(tr);
    });
    box.appendChild(summary);
    if (H > 1) {
      box.appendChild(el("h3", "", words.to_others));
      var list = el("ul", "others");
      list.id = "head-distances";
      for (var other = 0; other < H; other++) {
        if (other === state.head) { continue; }
        var d = layer.js_distance[state.head][other];
        var item = el("li", d !== null && d < diag.thresholds.near_duplicate_js ? "duplicate" : "");
        item.dataset.head = String(other);
        item.appendChild(el("span", "", fill(words.head_option, other + 1)));
        item.appendChild(el("span", "", fmt(d, 3)));
        list.appendChild(item);
      }
      box.appendChild(list);
    }
    box.appendChild(el("p", "legend", words.legend));
  }

  /* ---- hover / focus */
  function applyHover() {
    var hover = state.hover, w = weights();
    queryTokens.concat(keyTokens).forEach(function (token) {
      token.classList.remove("active"); token.style.backgroundColor = "";
    });
    rows.forEach(function (tr) { tr.classList.remove("row-highlight"); });
    table.querySelectorAll(".col-highlight").forEach(function (node) {
      node.classList.remove("col-highlight");
    });
    root.dataset.hover = hover === null ? "" : hover.kind + ":" + hover.index;
    if (hover === null) { return; }
    if (hover.kind === "query") {
      queryTokens[hover.index].classList.add("active");
      rows[hover.index].classList.add("row-highlight");
      keyTokens.forEach(function (token, k) {
        token.style.backgroundColor = "rgba(47,111,208," + w[hover.index][k].toFixed(3) + ")";
      });
    } else {
      keyTokens[hover.index].classList.add("active");
      keyHeaders[hover.index].classList.add("col-highlight");
      cells.forEach(function (rowCells) { rowCells[hover.index].classList.add("col-highlight"); });
      queryTokens.forEach(function (token, q) {
        token.style.backgroundColor = "rgba(217,130,43," + w[q][hover.index].toFixed(3) + ")";
      });
    }
  }
  function setHover(target) {
    var node = target && target.closest ? target.closest("[data-hover-kind]") : null;
    var hover = node && root.contains(node) ?
      {kind: node.dataset.hoverKind, index: Number(node.dataset.index)} : null;
    var old = state.hover;
    if (old === hover || (old && hover && old.kind === hover.kind && old.index === hover.index)) {
      return;
    }
    state.hover = hover;
    drawLines(); applyHover();
  }
  root.addEventListener("mouseover", function (event) { setHover(event.target); });
  root.addEventListener("mouseleave", function () { setHover(null); });
  root.addEventListener("focusin", function (event) { setHover(event.target); });

  function render() {
    root.dataset.layer = String(state.layer);
    root.dataset.head = String(state.head);
    paintHeatmap(); drawLines(); applyHover(); renderDiagnostics();
  }
  render();
  root.dataset.ready = "1";
})();
"""

_TEMPLATE = """<!DOCTYPE html>
<html lang="{lang_attr}">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="icon" href="data:,">
<style>{css}</style>
</head>
<body>
<div id="attnlab-view">
<header>
<h1 id="view-title">{title}</h1>
<div class="controls">
<label for="layer-select">{layer_label}</label> <select id="layer-select"></select>
<label for="head-select">{head_label}</label> <select id="head-select"></select>
</div>
</header>
<noscript><p>This page needs JavaScript to draw the attention view.</p></noscript>
<main>
<section class="panel" id="head-view">
<h2>{head_view}</h2>
<p class="hint">{head_view_hint}</p>
<div class="columns">
<div><div class="column-title">{queries}</div>
<div class="token-column" id="query-tokens"></div></div>
<svg id="lines" role="img" aria-label="{head_view}"></svg>
<div><div class="column-title">{keys}</div>
<div class="token-column" id="key-tokens"></div></div>
</div>
</section>
<section class="panel" id="heatmap-panel">
<h2>{heatmap}</h2>
<p class="hint">{heatmap_hint}</p>
<table id="heatmap"></table>
</section>
<section class="panel" id="diagnostics">
<h2>{diagnostics}</h2>
<div id="diagnostics-body"></div>
</section>
</main>
</div>
<script type="application/json" id="attnlab-data">{data}</script>
<script>{js}</script>
</body>
</html>
"""


def render_html(
    weights: Any,
    tokens: Sequence[str],
    *,
    key_tokens: Sequence[str] | None = None,
    diagnostics: Diagnostics | None = None,
    title: str | None = None,
    lang: Lang = "en",
) -> str:
    """One self-contained HTML page showing every head of ``weights``.

    Args:
        weights: (L, H, T, S) attention weights in [0, 1] (rows sum to 1), or (H, T, S).
        tokens: T query labels (also the key labels when S == T and ``key_tokens`` is None).
        key_tokens: S key labels, for cross-attention.
        diagnostics: the :class:`~attnlab.lens.diagnostics.Diagnostics` to show; by default
            ``diagnose(weights, tokens, key_tokens=key_tokens)``. Pass your own to account
            for padding or a causal mask.
        title: page title (default "Attention viewer" / "注意力查看器").
        lang: "en" or "zh" for the interface text.

    Returns:
        The page as a string; write it with :meth:`AttentionView.save` or open it in a
        browser. (L, H, T, S) -> str.
    """
    if lang not in _WORDS:
        raise AttnlabError(f"lang: expected 'en' or 'zh', got {lang!r}")
    if title is not None and not isinstance(title, str):
        raise AttnlabError(f"title: expected a str or None, got {type(title).__name__}")
    if title is not None:
        check_text(title, "title")
    w = _check_weights(weights)  # (L, H, T, S)
    L, H, T, S = w.shape
    query_labels = _labels(tokens, "tokens", T, "T")
    if key_tokens is not None:
        key_labels = _labels(key_tokens, "key_tokens", S, "S")
    elif S == T:
        key_labels = query_labels
    else:
        raise AttnlabError(
            f"key_tokens: expected {S} key labels since S = {S} differs from T = {T}, got None"
        )
    if diagnostics is None:
        diagnostics = diagnose(w, query_labels, key_tokens=key_labels)
    elif not isinstance(diagnostics, Diagnostics):
        raise AttnlabError(
            f"diagnostics: expected attnlab.lens.diagnostics.Diagnostics or None, got "
            f"{type(diagnostics).__name__}"
        )
    elif diagnostics.shape != w.shape:
        raise ShapeError(
            f"diagnostics: expected diagnostics of weights (L, H, T, S) = {shape_str(w.shape)}, "
            f"got {shape_str(diagnostics.shape)}"
        )

    words = _WORDS[lang]
    payload = {
        "shape": [L, H, T, S],
        "tokens": query_labels,
        "key_tokens": key_labels,
        "weights": np.round(w.astype(np.float64), _DECIMALS).tolist(),
        "diagnostics": {**diagnostics.to_dict(), "tokens": None, "key_tokens": None},
        "words": words,
        "row_px": _ROW_PX,
    }
    css, js = _CSS.strip(), _JS.strip()
    csp = (
        "default-src 'none'; "
        f"script-src '{_sha256(js)}'; style-src '{_sha256(css)}'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    page_title = html.escape(title if title is not None else words["title"])
    text = {key: html.escape(str(words[key])) for key in (
        "layer", "head", "head_view", "head_view_hint", "queries", "keys", "heatmap",
        "heatmap_hint", "diagnostics")}
    return _TEMPLATE.format(
        lang_attr="zh-CN" if lang == "zh" else "en",
        csp=csp,
        title=page_title,
        css=css,
        js=js,
        data=_script_json(payload),
        layer_label=text["layer"],
        head_label=text["head"],
        **{k: v for k, v in text.items() if k not in ("layer", "head")},
    )


class AttentionView:
    """The viewer page for one set of weights: shows itself in Jupyter, saves to disk.

    >>> import numpy as np
    >>> view = AttentionView(np.full((2, 3, 4, 4), 0.25), ["[CLS]", "a", "b", "[SEP]"])
    >>> view.html.count('<script type="application/json"')
    1
    """

    def __init__(
        self,
        weights: Any,
        tokens: Sequence[str],
        *,
        key_tokens: Sequence[str] | None = None,
        diagnostics: Diagnostics | None = None,
        title: str | None = None,
        lang: Lang = "en",
    ) -> None:
        # Read the labels once: a generator would be empty the second time.
        tokens = _as_list(tokens, "tokens")
        key_tokens = None if key_tokens is None else _as_list(key_tokens, "key_tokens")
        self.html = render_html(weights, tokens, key_tokens=key_tokens,
                                diagnostics=diagnostics, title=title, lang=lang)
        self.title = title
        self._rows = max(len(tokens), len(key_tokens or tokens))

    @classmethod
    def from_trace(
        cls,
        trace: Trace,
        *,
        diagnostics: Diagnostics | None = None,
        title: str | None = None,
        lang: Lang = "en",
    ) -> AttentionView:
        """The view of every ``weights`` step of a :class:`attnlab.Trace`."""
        return cls(trace_weights(trace), trace.tokens, key_tokens=trace.key_tokens,
                   diagnostics=diagnostics, title=title, lang=lang)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the page (UTF-8) to ``path``, creating its folder; returns the path."""
        if not isinstance(path, (str, os.PathLike)):
            raise AttnlabError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
        target = Path(path)
        make_folder(target.parent, "path")
        try:
            target.write_text(self.html, encoding="utf-8")
        except OSError as exc:
            raise AttnlabError(f"path: cannot write {os.fspath(path)!r} "
                               f"({exc.strerror or exc})") from None
        return target

    def _repr_html_(self) -> str:
        # A sandboxed iframe is a document of its own: ids, styles and scripts of several
        # views on one notebook page cannot collide, and the page cannot touch the notebook.
        height = min(900, max(420, 190 + self._rows * _ROW_PX))
        frame_id = f"attnlab-view-{next(_view_ids)}-{os.urandom(4).hex()}"
        label = html.escape(self.title or "attention viewer", quote=True)
        return (
            f'<iframe id="{frame_id}" class="attnlab-view" sandbox="allow-scripts" '
            f'title="{label}" style="width:100%;height:{height}px;border:0" '
            f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>'
        )


def _as_list(tokens: Any, name: str) -> Any:
    """A one-pass iterable of labels (a generator) as a list; anything else as it is."""
    if tokens is None or isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        return tokens  # refused with the expected size by _labels
    return list(tokens)


def _labels(tokens: Any, name: str, size: int, dim: str) -> list[str]:
    if tokens is None or isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise AttnlabError(
            f"{name}: expected a list of {size} token strings ({dim} = {size}), got {tokens!r}"
        )
    items = [check_text(str(t), f"{name}[{i}]") for i, t in enumerate(tokens)]
    if len(items) != size:
        raise AttnlabError(f"{name}: expected {size} labels ({dim} = {size}), got {len(items)}")
    return items


def _script_json(payload: Any) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' can end or open anything."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _sha256(source: str) -> str:
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")
