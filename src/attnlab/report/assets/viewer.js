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
