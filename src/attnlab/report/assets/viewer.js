(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attnlab-data").textContent);
  var words = data.words, diag = data.diagnostics;
  var L = data.shape[0], H = data.shape[1], T = data.shape[2], S = data.shape[3];
  var ROW = data.row_px, LINES_WIDTH = 150, ALL_LINES_LIMIT = 4096, THUMB = 48;
  /* Above this many keys a hovered row draws only the lines a reader can see. */
  var FAINT = S > 64 ? 0.002 : 0;
  var root = document.getElementById("attnlab-view");
  var layerSelect = document.getElementById("layer-select");
  var headSelect = document.getElementById("head-select");
  var statusLine = document.getElementById("status");
  var svg = document.getElementById("lines");
  var canvas = document.getElementById("heatmap");
  var overlay = document.getElementById("heatmap-overlay");
  var tip = document.getElementById("cell-tip");
  var state = {layer: 0, head: 0, hover: null, selected: []};
  var store = null, rolloutStore = null, shown = null;
  var digits = data.weights.bits === 16 ? 4 : 3;

  function el(tag, className, text) {
    var node = document.createElement(tag);
    if (className) { node.className = className; }
    if (text !== undefined) { node.textContent = text; }
    return node;
  }
  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } }
  function fmt(value, places) {
    return value === null || value === undefined ? words.none : value.toFixed(places);
  }
  function fill(template, n) { return template.replace("{n}", String(n)); }
  function layerName(l) { return fill(words.layer_option, data.layer_numbers[l]); }
  function headName(h) { return fill(words.head_option, data.head_numbers[h]); }

  /* ---- the compact weights: row maxima (float32) then integer codes, zlib, base64.
     viewer.py's encode_weights writes them; decode_weights there is the same inverse. */
  function unpack(encoded, buffer, heads, rows, cols) {
    var count = heads * rows;
    var view = new DataView(buffer), rowMax = new Float32Array(count);
    for (var i = 0; i < count; i++) { rowMax[i] = view.getFloat32(4 * i, true); }
    var codes;
    if (encoded.bits === 16) {
      codes = new Uint16Array(count * cols);
      for (var j = 0; j < codes.length; j++) { codes[j] = view.getUint16(4 * count + 2 * j, true); }
    } else {
      codes = new Uint8Array(buffer, 4 * count, count * cols);
    }
    return {rowMax: rowMax, codes: codes, levels: encoded.bits === 16 ? 65535 : 255,
            rows: rows, cols: cols};
  }
  function inflate(encoded) {
    var text = atob(encoded.data), bytes = new Uint8Array(text.length);
    for (var i = 0; i < text.length; i++) { bytes[i] = text.charCodeAt(i); }
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }
  /* One head's weights, (T, S) row-major, into `out` (a Float32Array of T * S). */
  function headInto(source, index, out) {
    var rows = source.rows, cols = source.cols, base = index * rows;
    for (var q = 0; q < rows; q++) {
      var scale = source.rowMax[base + q] / source.levels, offset = (base + q) * cols;
      for (var k = 0; k < cols; k++) { out[q * cols + k] = source.codes[offset + k] * scale; }
    }
    return out;
  }

  /* Colour scale close to matplotlib's YlGnBu, as in the PNG heatmaps. */
  var STOPS = [[255,255,217],[237,248,177],[199,233,180],[127,205,187],[65,182,196],
               [29,145,192],[34,94,168],[37,52,148],[8,29,88]];
  var PALETTE = (function () {
    var table = new Uint8Array(256 * 3);
    for (var n = 0; n < 256; n++) {
      var x = n / 255 * (STOPS.length - 1);
      var i = Math.min(STOPS.length - 2, Math.floor(x)), f = x - i;
      for (var c = 0; c < 3; c++) {
        table[3 * n + c] = Math.round(STOPS[i][c] + f * (STOPS[i + 1][c] - STOPS[i][c]));
      }
    }
    return table;
  })();
  function paint(target, values, rows, cols, cell) {
    target.width = cols * cell; target.height = rows * cell;
    target.style.width = cols * cell + "px"; target.style.height = rows * cell + "px";
    var image = new ImageData(cols, rows), px = image.data;
    for (var i = 0; i < rows * cols; i++) {
      var n = Math.max(0, Math.min(255, Math.round(values[i] * 255)));
      px[4 * i] = PALETTE[3 * n]; px[4 * i + 1] = PALETTE[3 * n + 1];
      px[4 * i + 2] = PALETTE[3 * n + 2]; px[4 * i + 3] = 255;
    }
    var context = target.getContext("2d");
    if (cell === 1) { context.putImageData(image, 0, 0); return context; }
    var small = document.createElement("canvas");
    small.width = cols; small.height = rows;
    small.getContext("2d").putImageData(image, 0, 0);
    context.imageSmoothingEnabled = false;
    context.drawImage(small, 0, 0, cols * cell, rows * cell);
    return context;
  }
  function cellSize(rows, cols, room) {
    return Math.max(1, Math.min(36, Math.floor(room / Math.max(rows, cols))));
  }
  var CELL = cellSize(T, S, 576), SHOW_NUMBERS = CELL >= 28, SHOW_LABELS = CELL >= 14;

  /* ---- controls */
  function addOptions(select, count, name) {
    for (var n = 0; n < count; n++) {
      var option = el("option", "", name(n));
      option.value = String(n);
      select.appendChild(option);
    }
  }
  addOptions(layerSelect, L, layerName);
  addOptions(headSelect, H, headName);
  function choose(layer, head) {
    state.layer = layer; state.head = head;
    layerSelect.value = String(layer); headSelect.value = String(head);
    render();
  }
  layerSelect.addEventListener("change", function () {
    choose(Number(layerSelect.value), state.head);
  });
  headSelect.addEventListener("change", function () {
    choose(state.layer, Number(headSelect.value));
  });

  /* ---- head view: token columns (text via textContent only) */
  var queryTokens = [], keyTokens = [];
  function buildColumn(id, kind, labels, list) {
    var column = document.getElementById(id);
    labels.forEach(function (label, index) {
      var token = el("div", "token " + kind, label);
      token.dataset.index = String(index);
      token.dataset.hoverKind = kind;
      token.title = label;
      token.tabIndex = 0;
      column.appendChild(token);
      list.push(token);
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
  /* The query rows in focus: the selected ones, then the hovered one. */
  function focusRows() {
    var rows = state.selected.slice(), hover = state.hover;
    if (hover && hover.kind === "query" && rows.indexOf(hover.index) < 0) { rows.push(hover.index); }
    return rows;
  }
  function drawLines() {
    clear(svg);
    var w = shown, hover = state.hover, rows = focusRows(), q, k;
    if (hover && hover.kind === "key") {
      for (q = 0; q < T; q++) {
        var weight = w[q * S + hover.index];
        if (FAINT === 0 || weight > FAINT) { line(q, hover.index, weight, "attn-line focus key-focus"); }
      }
    } else if (rows.length) {
      rows.forEach(function (row) {
        for (k = 0; k < S; k++) {
          if (FAINT === 0 || w[row * S + k] > FAINT) { line(row, k, w[row * S + k], "attn-line focus"); }
        }
      });
    } else if (T * S <= ALL_LINES_LIMIT) {
      for (q = 0; q < T; q++) {
        for (k = 0; k < S; k++) { line(q, k, w[q * S + k] * 0.6, "attn-line"); }
      }
    }
  }

  /* ---- heatmap on a canvas, with axis labels (small heads) and highlight overlays */
  (function buildAxes() {
    if (!SHOW_LABELS) { return; }
    var keys = document.getElementById("heatmap-keys");
    var queries = document.getElementById("heatmap-queries");
    keys.style.paddingLeft = "0px";
    data.key_tokens.forEach(function (label, k) {
      var node = el("div", "axis-label key", label);
      node.style.width = CELL + "px";
      node.dataset.hoverKind = "key"; node.dataset.index = String(k); node.title = label;
      keys.appendChild(node);
    });
    data.tokens.forEach(function (label, q) {
      var node = el("div", "axis-label query", label);
      node.style.height = CELL + "px"; node.style.lineHeight = CELL + "px";
      node.dataset.hoverKind = "query"; node.dataset.index = String(q); node.title = label;
      queries.appendChild(node);
    });
  })();
  function paintHeatmap() {
    var context = paint(canvas, shown, T, S, CELL);
    canvas.dataset.layer = String(state.layer); canvas.dataset.head = String(state.head);
    if (!SHOW_NUMBERS) { return; }
    context.font = "11px system-ui, sans-serif";
    context.textAlign = "center"; context.textBaseline = "middle";
    for (var q = 0; q < T; q++) {
      for (var k = 0; k < S; k++) {
        var value = shown[q * S + k];
        context.fillStyle = value > 0.55 ? "#fff" : "#1d2433";
        context.fillText(value.toFixed(2), (k + 0.5) * CELL, (q + 0.5) * CELL);
      }
    }
  }
  function band(className, attribute, index, vertical) {
    var node = el("div", className);
    node.dataset[attribute] = String(index);
    if (vertical) {
      node.style.left = index * CELL + "px"; node.style.width = CELL + "px";
    } else {
      node.style.top = index * CELL + "px"; node.style.height = CELL + "px";
    }
    overlay.appendChild(node);
  }
  canvas.addEventListener("mousemove", function (event) {
    var rect = canvas.getBoundingClientRect();
    var k = Math.floor((event.clientX - rect.left) / CELL);
    var q = Math.floor((event.clientY - rect.top) / CELL);
    if (q < 0 || q >= T || k < 0 || k >= S) { return; }
    tip.textContent = data.tokens[q] + " \u2192 " + data.key_tokens[k] + ": " +
      shown[q * S + k].toFixed(digits);
    setHover({kind: "query", index: q});
  });
  canvas.addEventListener("mouseleave", function () { tip.textContent = ""; });

  /* ---- overview: every head as a thumbnail, with layer and head filters */
  var thumbs = [];
  function buildOverview() {
    var grid = document.getElementById("overview-grid");
    var rowsOf = [];
    for (var l = 0; l < L; l++) {
      var row = el("div", "overview-row");
      row.dataset.layer = String(l);
      row.appendChild(el("span", "overview-label", layerName(l)));
      for (var h = 0; h < H; h++) {
        var thumb = el("canvas", "thumb");
        thumb.dataset.layer = String(l); thumb.dataset.head = String(h);
        thumb.title = layerName(l) + " \u00b7 " + headName(h);
        thumb.width = THUMB; thumb.height = THUMB;
        thumb.addEventListener("click", (function (layer, head) {
          return function () { choose(layer, head); };
        })(l, h));
        row.appendChild(thumb); thumbs.push(thumb);
      }
      grid.appendChild(row); rowsOf.push(row);
    }
    function filters(id, count, name, onToggle) {
      var box = document.getElementById(id);
      for (var n = 0; n < count; n++) {
        var label = el("label", "filter"), input = el("input");
        input.type = "checkbox"; input.checked = true; input.dataset.index = String(n);
        input.addEventListener("change", onToggle);
        label.appendChild(input); label.appendChild(document.createTextNode(" " + name(n)));
        box.appendChild(label);
      }
    }
    function hidden(id) {
      var off = [];
      document.querySelectorAll("#" + id + " input").forEach(function (input) {
        if (!input.checked) { off.push(Number(input.dataset.index)); }
      });
      return off;
    }
    function applyFilters() {
      var layersOff = hidden("layer-filter"), headsOff = hidden("head-filter");
      rowsOf.forEach(function (row, l) { row.classList.toggle("hidden", layersOff.indexOf(l) >= 0); });
      thumbs.forEach(function (thumb) {
        thumb.classList.toggle("hidden", headsOff.indexOf(Number(thumb.dataset.head)) >= 0);
      });
    }
    if (L > 1) { filters("layer-filter", L, layerName, applyFilters); }
    if (H > 1) { filters("head-filter", H, headName, applyFilters); }
  }
  /* Thumbnails are drawn a few at a time after the page is ready, so that a 72-head page
     at T = 512 opens at once and fills its overview in the background. */
  function drawThumbnails() {
    var buffer = new Float32Array(T * S), next = 0;
    var scale = Math.min(THUMB / S, THUMB / T);
    var small = document.createElement("canvas");
    function step() {
      var stop = Math.min(thumbs.length, next + 4);
      for (; next < stop; next++) {
        headInto(store, next, buffer);
        var image = new ImageData(S, T), px = image.data;
        for (var i = 0; i < T * S; i++) {
          var n = Math.max(0, Math.min(255, Math.round(buffer[i] * 255)));
          px[4 * i] = PALETTE[3 * n]; px[4 * i + 1] = PALETTE[3 * n + 1];
          px[4 * i + 2] = PALETTE[3 * n + 2]; px[4 * i + 3] = 255;
        }
        small.width = S; small.height = T;
        small.getContext("2d").putImageData(image, 0, 0);
        var context = thumbs[next].getContext("2d");
        context.imageSmoothingEnabled = scale < 1;
        context.clearRect(0, 0, THUMB, THUMB);
        context.drawImage(small, 0, 0, S * scale, T * scale);
      }
      if (next < thumbs.length) { setTimeout(step, 0); } else { root.dataset.overviewReady = "1"; }
    }
    step();
  }

  /* ---- rollout and importance (optional) */
  function renderRollout() {
    if (!rolloutStore) { return; }
    var target = document.getElementById("rollout");
    paint(target, headInto(rolloutStore, 0, new Float32Array(T * S)), T, S,
          cellSize(T, S, 384));
  }
  function renderImportance() {
    if (!data.importance) { return; }
    var table = document.getElementById("importance-table");
    clear(table);
    var top = 0;
    data.importance.forEach(function (row) {
      row.forEach(function (v) { top = Math.max(top, v); });
    });
    var head = el("tr");
    head.appendChild(el("th", "", ""));
    for (var h = 0; h < H; h++) { head.appendChild(el("th", "", String(data.head_numbers[h]))); }
    table.appendChild(head);
    data.importance.forEach(function (row, l) {
      var tr = el("tr");
      tr.appendChild(el("th", "", layerName(l)));
      row.forEach(function (v, h) {
        var td = el("td", l === state.layer && h === state.head ? "current" : "", v.toFixed(3));
        td.dataset.layer = String(l); td.dataset.head = String(h);
        var n = top > 0 ? Math.round(v / top * 255) : 0;
        td.style.backgroundColor = "rgb(" + PALETTE[3 * n] + "," + PALETTE[3 * n + 1] + "," +
          PALETTE[3 * n + 2] + ")";
        td.style.color = n > 140 ? "#fff" : "#1d2433";
        td.addEventListener("click", function () { choose(l, h); });
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
  }

  /* ---- diagnostics */
  function renderDiagnostics() {
    var box = document.getElementById("diagnostics-body");
    clear(box);
    if (!diag) { return; }
    var record = diag.heads[state.layer * H + state.head], layer = diag.layers[state.layer];
    box.appendChild(el("h3", "", words.this_head + " \u00b7 " + layerName(state.layer) +
      " \u00b7 " + headName(state.head)));
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
      return headName(pair[0]) + " ~ " + headName(pair[1]) + " (" + pair[2].toFixed(3) + ")";
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
        item.appendChild(el("span", "", headName(other)));
        item.appendChild(el("span", "", fmt(d, 3)));
        list.appendChild(item);
      }
      box.appendChild(list);
    }
    box.appendChild(el("p", "legend", words.js_explained));
    box.appendChild(el("p", "legend", words.legend));
  }

  /* ---- hover, focus and selection */
  function applyHover() {
    var hover = state.hover, w = shown, rows = focusRows();
    queryTokens.concat(keyTokens).forEach(function (token) {
      token.classList.remove("active"); token.style.backgroundColor = "";
    });
    queryTokens.forEach(function (token, q) {
      token.classList.toggle("selected", state.selected.indexOf(q) >= 0);
    });
    clear(overlay);
    root.dataset.hover = hover === null ? "" : hover.kind + ":" + hover.index;
    root.dataset.selected = state.selected.join(",");
    if (hover && hover.kind === "key") {
      keyTokens[hover.index].classList.add("active");
      band("col-highlight", "col", hover.index, true);
      queryTokens.forEach(function (token, q) {
        token.style.backgroundColor = "rgba(217,130,43," + w[q * S + hover.index].toFixed(3) + ")";
      });
      return;
    }
    rows.forEach(function (q) {
      queryTokens[q].classList.add("active");
      band("row-highlight", "row", q, false);
    });
    if (!rows.length) { return; }
    keyTokens.forEach(function (token, k) {
      var most = 0;
      rows.forEach(function (q) { most = Math.max(most, w[q * S + k]); });
      token.style.backgroundColor = "rgba(47,111,208," + most.toFixed(3) + ")";
    });
  }
  function setHover(hover) {
    var old = state.hover;
    if (old === hover || (old && hover && old.kind === hover.kind && old.index === hover.index)) {
      return;
    }
    state.hover = hover;
    if (shown) { drawLines(); applyHover(); }
  }
  function hoverOf(target) {
    var node = target && target.closest ? target.closest("[data-hover-kind]") : null;
    return node && root.contains(node) ?
      {kind: node.dataset.hoverKind, index: Number(node.dataset.index)} : null;
  }
  root.addEventListener("mouseover", function (event) {
    if (event.target !== canvas) { setHover(hoverOf(event.target)); }
  });
  root.addEventListener("mouseleave", function () { setHover(null); });
  root.addEventListener("focusin", function (event) { setHover(hoverOf(event.target)); });
  root.addEventListener("click", function (event) {
    var hover = hoverOf(event.target);
    if (!hover || hover.kind !== "query" || !shown) { return; }
    var at = state.selected.indexOf(hover.index);
    if (at >= 0) { state.selected.splice(at, 1); } else { state.selected.push(hover.index); }
    drawLines(); applyHover();
  });

  function render() {
    root.dataset.layer = String(state.layer);
    root.dataset.head = String(state.head);
    shown = headInto(store, state.layer * H + state.head, shown || new Float32Array(T * S));
    thumbs.forEach(function (thumb) {
      thumb.classList.toggle("current", Number(thumb.dataset.layer) === state.layer &&
                             Number(thumb.dataset.head) === state.head);
    });
    paintHeatmap(); drawLines(); applyHover(); renderImportance(); renderDiagnostics();
  }

  /* For scripts and tests: the weights of any head as the page decoded them. */
  root.attnlab = {
    head: function (layer, head) {
      return Array.from(headInto(store, layer * H + head, new Float32Array(T * S)));
    },
    shown: function () { return Array.from(shown); }
  };

  buildOverview();
  var pending = [inflate(data.weights).then(function (buffer) {
    store = unpack(data.weights, buffer, L * H, T, S);
  })];
  if (data.rollout) {
    pending.push(inflate(data.rollout).then(function (buffer) {
      rolloutStore = unpack(data.rollout, buffer, 1, T, S);
    }));
    document.getElementById("rollout-panel").classList.remove("hidden");
  }
  if (data.importance) { document.getElementById("importance-panel").classList.remove("hidden"); }
  if (digits < 4) { document.getElementById("precision-note").textContent = words.precision_8bit; }
  Promise.all(pending).then(function () {
    statusLine.textContent = "";
    render(); renderRollout();
    root.dataset.ready = "1";
    drawThumbnails();
  }).catch(function (error) {
    statusLine.textContent = words.decode_error + " (" + error + ")";
    root.dataset.ready = "error";
  });
})();
