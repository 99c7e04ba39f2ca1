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
  var state = {layer: 0, head: 0, hover: null, selected: [], overlay: [], measure: "weights",
               segment: "all", visible: T, pair: null};
  var store = null, rolloutStore = null, shown = null, weightsShown = null;
  var allowedBits = null, norms = null, neuron = null, divisor = 1, sinks = [];
  var digits = data.weights.bits === 16 ? 4 : 3;
  /* Decoders: tokens from P on were generated; the step slider shows the first P + n. */
  var P = data.prompt_length || T, GROUP = data.heads_per_kv || 0;
  var segments = data.segments || null;
  var HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                      "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  if (data.start) { state.layer = data.start[0]; state.head = data.start[1]; }

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

  /* Float32 arrays packed by viewer_data.pack_floats (float32, zlib, base64). */
  function floats(text) {
    return inflate({data: text}).then(function (buffer) { return new Float32Array(buffer); });
  }
  function allowedAt(q, k) {
    if (!allowedBits) { return true; }
    var n = q * S + k;
    return (allowedBits[n >> 3] & (128 >> (n & 7))) !== 0;
  }
  /* Rows and keys beyond the current generation step do not exist yet. */
  function inStep(q, k) { return q < state.visible && k < state.visible; }
  function segmentOk(q, k) {
    if (!segments || state.segment === "all") { return true; }
    return segments[q] === (state.segment[0] === "A" ? 0 : 1) &&
      segments[k] === (state.segment[1] === "A" ? 0 : 1);
  }
  function shows(q, k) { return allowedAt(q, k) && inStep(q, k) && segmentOk(q, k); }
  function kvOf(h) {
    if (GROUP) { return Math.floor((data.head_numbers[h] - 1) / GROUP); }
    return neuron ? Math.floor(h * data.neuron.kv_heads / H) : 0;
  }
  function groupOf(h) { return GROUP ? Math.floor((data.head_numbers[h] - 1) / GROUP) : 0; }

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
  function paint(target, values, rows, cols, cell, top) {
    var unit = 255 / (top || 1);
    target.width = cols * cell; target.height = rows * cell;
    target.style.width = cols * cell + "px"; target.style.height = rows * cell + "px";
    var image = new ImageData(cols, rows), px = image.data;
    for (var i = 0; i < rows * cols; i++) {
      var n = Math.max(0, Math.min(255, Math.round(values[i] * unit)));
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
  function colourBar(id, low, high, top) {
    var bar = document.getElementById(id), context = bar.getContext("2d");
    for (var x = 0; x < bar.width; x++) {
      var n = Math.round(x / (bar.width - 1) * 255);
      context.fillStyle = "rgb(" + PALETTE[3 * n] + "," + PALETTE[3 * n + 1] + "," +
        PALETTE[3 * n + 2] + ")";
      context.fillRect(x, 0, 1, bar.height);
    }
    document.getElementById(low).textContent = words.scale_low;
    document.getElementById(high).textContent = top === 1 ? "1" :
      fill(words.scale_high.replace("{v}", "{n}"), top.toPrecision(3));
  }
  /* Hatching for the positions a query may not attend to (never a weight of 0.00). */
  var HATCH = (function () {
    var tile = document.createElement("canvas");
    tile.width = 6; tile.height = 6;
    var context = tile.getContext("2d");
    context.fillStyle = "#ffffff"; context.fillRect(0, 0, 6, 6);
    context.strokeStyle = "#a7adba"; context.lineWidth = 1.2;
    context.beginPath(); context.moveTo(-1, 7); context.lineTo(7, -1); context.stroke();
    return tile;
  })();
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
  if (GROUP > 1) {
    /* Heads that share one key/value head (GQA) are listed together. */
    var group = null, groupNumber = -1;
    for (var h0 = 0; h0 < H; h0++) {
      if (groupOf(h0) !== groupNumber) {
        groupNumber = groupOf(h0);
        group = el("optgroup");
        group.label = fill(words.kv_group, groupNumber + 1);
        group.dataset.group = String(groupNumber);
        headSelect.appendChild(group);
      }
      var option = el("option", "", headName(h0));
      option.value = String(h0);
      group.appendChild(option);
    }
  } else {
    addOptions(headSelect, H, headName);
  }
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
      var token = el("div", "token " + kind + (index >= P ? " generated" : ""), label);
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

  function line(q, k, weight, className, head) {
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
    node.setAttribute("data-head", String(head));
    if (state.overlay.length) { node.setAttribute("stroke", HEAD_COLOURS[head % 10]); }
    svg.appendChild(node);
  }
  /* The query rows in focus: the selected ones, then the hovered one. */
  function focusRows() {
    var rows = state.selected.slice(), hover = state.hover;
    if (hover && hover.kind === "query" && rows.indexOf(hover.index) < 0) { rows.push(hover.index); }
    return rows;
  }
  /* The heads whose lines are drawn: the shown one, then those ticked for overlay. */
  var overlayBuffers = {};
  function lineHeads() {
    var heads = [state.head];
    state.overlay.forEach(function (h) { if (heads.indexOf(h) < 0) { heads.push(h); } });
    return heads;
  }
  function weightsOf(h) {
    if (h === state.head) { return shown; }
    var values = headInto(store, state.layer * H + h, overlayBuffers[h] || new Float32Array(T * S));
    overlayBuffers[h] = values;
    if (state.measure === "norms") { scaleByNorms(values, h); }
    return values;
  }
  function drawLines() {
    clear(svg);
    var hover = state.hover, rows = focusRows(), q, k;
    lineHeads().forEach(function (h) {
      var w = weightsOf(h), top = state.measure === "norms" ? divisor : 1;
      if (hover && hover.kind === "key") {
        for (q = 0; q < T; q++) {
          var weight = w[q * S + hover.index] / top;
          if (shows(q, hover.index) && (FAINT === 0 || weight > FAINT)) {
            line(q, hover.index, weight, "attn-line focus key-focus", h);
          }
        }
      } else if (rows.length) {
        rows.forEach(function (row) {
          for (k = 0; k < S; k++) {
            if (shows(row, k) && (FAINT === 0 || w[row * S + k] / top > FAINT)) {
              line(row, k, w[row * S + k] / top, "attn-line focus", h);
            }
          }
        });
      } else if (T * S <= ALL_LINES_LIMIT) {
        for (q = 0; q < T; q++) {
          for (k = 0; k < S; k++) {
            if (shows(q, k)) { line(q, k, w[q * S + k] / top * 0.6, "attn-line", h); }
          }
        }
      }
    });
  }

  /* ---- heatmap on a canvas, with axis labels (small heads) and highlight overlays */
  (function buildAxes() {
    if (!SHOW_LABELS) { return; }
    var keys = document.getElementById("heatmap-keys");
    var queries = document.getElementById("heatmap-queries");
    keys.style.paddingLeft = "0px";
    data.key_tokens.forEach(function (label, k) {
      var node = el("div", "axis-label key" + (k >= P ? " generated" : ""), label);
      node.style.width = CELL + "px";
      node.dataset.hoverKind = "key"; node.dataset.index = String(k); node.title = label;
      keys.appendChild(node);
    });
    data.tokens.forEach(function (label, q) {
      var node = el("div", "axis-label query" + (q >= P ? " generated" : ""), label);
      node.style.height = CELL + "px"; node.style.lineHeight = CELL + "px";
      node.dataset.hoverKind = "query"; node.dataset.index = String(q); node.title = label;
      queries.appendChild(node);
    });
  })();
  function paintHeatmap() {
    var context = paint(canvas, shown, T, S, CELL, divisor);
    canvas.dataset.layer = String(state.layer); canvas.dataset.head = String(state.head);
    /* Not allowed: hatched; not generated yet: grey; outside the A/B filter: faded. */
    var hatch = context.createPattern(HATCH, "repeat"), q, k;
    for (q = 0; q < T; q++) {
      if (q >= state.visible) {
        context.fillStyle = "#eef0f4"; context.fillRect(0, q * CELL, S * CELL, CELL);
        continue;
      }
      for (k = 0; k < S; k++) {
        if (!allowedAt(q, k)) {
          var end = k;
          while (end + 1 < S && !allowedAt(q, end + 1)) { end++; }
          context.fillStyle = hatch;
          context.fillRect(k * CELL, q * CELL, (end - k + 1) * CELL, CELL);
          k = end;
        } else if (k >= state.visible) {
          context.fillStyle = "#eef0f4"; context.fillRect(k * CELL, q * CELL, CELL, CELL);
        } else if (!segmentOk(q, k)) {
          context.fillStyle = "rgba(255,255,255,0.8)";
          context.fillRect(k * CELL, q * CELL, CELL, CELL);
        }
      }
    }
    if (state.visible < T && P < T) {
      context.fillStyle = "#1d6b35";
      context.fillRect(0, P * CELL - 1, S * CELL, 1);
    }
    colourBar("heatmap-scale", "heatmap-scale-low", "heatmap-scale-high", divisor);
    if (!SHOW_NUMBERS) { return; }
    context.font = "11px system-ui, sans-serif";
    context.textAlign = "center"; context.textBaseline = "middle";
    for (q = 0; q < T; q++) {
      for (k = 0; k < S; k++) {
        if (!shows(q, k)) { continue; }
        var value = shown[q * S + k];
        context.fillStyle = value / divisor > 0.55 ? "#fff" : "#1d2433";
        context.fillText(value.toFixed(2), (k + 0.5) * CELL, (q + 0.5) * CELL);
      }
    }
  }
  /* Sink columns: keys taking far more of the rows' weight than chance would give them. */
  function findSinks() {
    var found = [], limit = Math.min(state.visible, S), w = weightsShown;
    var share = diag && diag.thresholds ? diag.thresholds.sink_chance_ratio : 1.5;
    var counts = new Float32Array(T);
    for (var q = 0; q < Math.min(state.visible, T); q++) {
      for (var j = 0; j < limit; j++) { if (allowedAt(q, j)) { counts[q]++; } }
    }
    for (var k = 0; k < limit; k++) {
      var total = 0, chance = 0, rows = 0;
      for (q = 0; q < Math.min(state.visible, T); q++) {
        if (!allowedAt(q, k)) { continue; }
        total += w[q * S + k]; chance += 1 / counts[q]; rows++;
      }
      if (rows && total / rows >= 0.3 && total > share * chance) {
        found.push([k, total / rows]);
      }
    }
    return found;
  }
  function renderSinks() {
    var box = document.getElementById("heatmap-sinks");
    clear(box);
    box.style.position = "relative"; box.style.width = S * CELL + "px";
    sinks = findSinks();
    sinks.forEach(function (pair) {
      var mark = el("div", "sink-mark", "\u25bc");
      mark.dataset.col = String(pair[0]);
      mark.title = data.key_tokens[pair[0]] + ": " +
        words.sink_mark.replace("{share}", pair[1].toFixed(2));
      mark.style.position = "absolute";
      mark.style.left = (pair[0] * CELL + CELL / 2 - 5) + "px"; mark.style.width = "10px";
      box.appendChild(mark);
    });
    root.dataset.sinks = sinks.map(function (pair) { return pair[0]; }).join(",");
    document.getElementById("sink-box").classList.toggle("hidden", !sinks.length);
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
    var label = data.tokens[q] + " \u2192 " + data.key_tokens[k] + ": ";
    if (!allowedAt(q, k)) {
      tip.textContent = label + words.not_allowed;
    } else if (!inStep(q, k)) {
      tip.textContent = label + words.not_yet;
    } else {
      tip.textContent = label + shown[q * S + k].toFixed(digits) +
        (state.measure === "norms" ? " (\u2016\u03b1\u00b7v\u00b7W_O\u2016, \u03b1 = " +
         weightsShown[q * S + k].toFixed(digits) + ")" : "");
    }
    setHover({kind: "query", index: q});
  });
  canvas.addEventListener("click", function (event) {
    var rect = canvas.getBoundingClientRect();
    var k = Math.floor((event.clientX - rect.left) / CELL);
    var q = Math.floor((event.clientY - rect.top) / CELL);
    if (q < 0 || q >= T || k < 0 || k >= S || !neuron) { return; }
    state.pair = [q, k]; renderNeuron();
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
        var thumb = el("canvas", "thumb" +
          (GROUP > 1 && h > 0 && groupOf(h) !== groupOf(h - 1) ? " group-start" : ""));
        thumb.dataset.layer = String(l); thumb.dataset.head = String(h);
        if (GROUP) { thumb.dataset.group = String(groupOf(h)); }
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
    var values = headInto(rolloutStore, 0, new Float32Array(T * S)), top = 0;
    for (var i = 0; i < values.length; i++) { top = Math.max(top, values[i]); }
    var cell = cellSize(T, S, 384);
    paint(target, values, T, S, cell, top || 1);
    colourBar("rollout-scale", "rollout-scale-low", "rollout-scale-high", top || 1);
    /* Token labels: every token while they fit, else every n-th one. */
    var every = Math.max(1, Math.ceil(12 / cell));
    var keys = document.getElementById("rollout-keys");
    var queries = document.getElementById("rollout-queries");
    clear(keys); clear(queries);
    keys.style.position = "relative"; keys.style.height = "14px";
    queries.style.position = "relative"; queries.style.width = "8em";
    for (var k = 0; k < S; k += every) {
      var label = el("div", "axis-label key", data.key_tokens[k]);
      label.style.position = "absolute"; label.style.left = k * cell + "px";
      label.style.width = Math.max(cell * every, 12) + "px"; label.dataset.index = String(k);
      keys.appendChild(label);
    }
    for (var q = 0; q < T; q += every) {
      var row = el("div", "axis-label query", data.tokens[q]);
      row.style.position = "absolute"; row.style.top = q * cell + "px"; row.style.right = "0";
      row.style.lineHeight = cell * Math.min(every, 1) + "px"; row.dataset.index = String(q);
      queries.appendChild(row);
    }
    target.addEventListener("mousemove", function (event) {
      var rect = target.getBoundingClientRect();
      var kk = Math.floor((event.clientX - rect.left) / cell);
      var qq = Math.floor((event.clientY - rect.top) / cell);
      if (qq < 0 || qq >= T || kk < 0 || kk >= S) { return; }
      tip.textContent = words.rollout + ": " + data.tokens[qq] + " \u2190 " +
        data.key_tokens[kk] + ": " + values[qq * S + kk].toFixed(digits);
    });
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
    /* shown_flags: as the text table words them (a previous-token head is one-hot by
       design, not "over-sparse"); see attnlab.report.text.shown_flags. */
    record.shown_flags.forEach(function (name) {
      var badge = el("span", "flag", words.flag_text[name] || name);
      badge.dataset.flag = name;
      flags.appendChild(badge);
    });
    if (!record.shown_flags.length) { flags.appendChild(el("span", "flag none", words.no_flags)); }
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
      token.classList.toggle("future", q >= state.visible);
      token.classList.toggle("dim", !!segments && state.segment !== "all" &&
        segments[q] !== (state.segment[0] === "A" ? 0 : 1));
    });
    keyTokens.forEach(function (token, k) {
      token.classList.toggle("future", k >= state.visible);
      token.classList.toggle("dim", !!segments && state.segment !== "all" &&
        segments[k] !== (state.segment[1] === "A" ? 0 : 1));
    });
    clear(overlay);
    root.dataset.hover = hover === null ? "" : hover.kind + ":" + hover.index;
    root.dataset.selected = state.selected.join(",");
    if (hover && hover.kind === "key") {
      keyTokens[hover.index].classList.add("active");
      band("col-highlight", "col", hover.index, true);
      queryTokens.forEach(function (token, q) {
        var value = shows(q, hover.index) ? w[q * S + hover.index] / divisor : 0;
        token.style.backgroundColor = "rgba(217,130,43," + value.toFixed(3) + ")";
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
      rows.forEach(function (q) { if (shows(q, k)) { most = Math.max(most, w[q * S + k] / divisor); } });
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

  function scaleByNorms(values, h) {
    var base = (state.layer * H + h) * S;
    for (var q = 0; q < T; q++) {
      for (var k = 0; k < S; k++) { values[q * S + k] *= norms[base + k]; }
    }
  }
  function render() {
    root.dataset.layer = String(state.layer);
    root.dataset.head = String(state.head);
    root.dataset.measure = state.measure;
    root.dataset.step = String(state.visible - P);
    root.dataset.segment = state.segment;
    weightsShown = headInto(store, state.layer * H + state.head,
                            weightsShown || new Float32Array(T * S));
    shown = shown || new Float32Array(T * S);
    shown.set(weightsShown);
    divisor = 1;
    if (state.measure === "norms") {
      scaleByNorms(shown, state.head);
      divisor = 0;
      for (var i = 0; i < shown.length; i++) { divisor = Math.max(divisor, shown[i]); }
      divisor = divisor || 1;
    }
    thumbs.forEach(function (thumb) {
      thumb.classList.toggle("current", Number(thumb.dataset.layer) === state.layer &&
                             Number(thumb.dataset.head) === state.head);
    });
    overlayBoxes.forEach(function (box, h) {
      box.checked = h === state.head || state.overlay.indexOf(h) >= 0;
      box.disabled = h === state.head;
    });
    paintHeatmap(); renderSinks(); drawLines(); applyHover(); renderImportance();
    renderDiagnostics(); renderNeuron(); fitFrame();
  }

  /* ---- several heads overlaid in the head view, each in its colour (BertViz-style) */
  var overlayBoxes = [];
  if (H > 1) {
    var overlayBox = document.getElementById("overlay-heads");
    for (var oh = 0; oh < H; oh++) {
      var holder = el("label", "overlay-head"), box = el("input");
      var swatch = el("span", "swatch");
      swatch.style.background = HEAD_COLOURS[oh % 10];
      box.type = "checkbox"; box.dataset.head = String(oh);
      box.addEventListener("change", (function (head) {
        return function (event) {
          var at = state.overlay.indexOf(head);
          if (event.target.checked && at < 0) { state.overlay.push(head); }
          if (!event.target.checked && at >= 0) { state.overlay.splice(at, 1); }
          root.dataset.overlay = state.overlay.join(",");
          drawLines(); applyHover();
        };
      })(oh));
      holder.appendChild(box); holder.appendChild(swatch);
      holder.appendChild(document.createTextNode(headName(oh)));
      overlayBox.appendChild(holder); overlayBoxes.push(box);
    }
    document.getElementById("overlay-control").classList.remove("hidden");
  }

  /* ---- weights or value-weighted norms; sentence filters; the generation step */
  var measureSelect = document.getElementById("measure-select");
  [["weights", words.measure_weights], ["norms", words.measure_norms]].forEach(function (pair) {
    var option = el("option", "", pair[1]);
    option.value = pair[0];
    measureSelect.appendChild(option);
  });
  measureSelect.addEventListener("change", function () {
    state.measure = measureSelect.value; render();
  });
  var segmentSelect = document.getElementById("segment-select");
  Object.keys(words.segment_options).forEach(function (key) {
    var option = el("option", "", words.segment_options[key]);
    option.value = key === "all" ? "all" : key;
    segmentSelect.appendChild(option);
  });
  segmentSelect.addEventListener("change", function () {
    state.segment = segmentSelect.value; render();
  });
  var slider = document.getElementById("step-slider");
  function setStep(n) {
    state.visible = P + n;
    slider.value = String(n);
    document.getElementById("step-label").textContent = words.step_label
      .replace("{n}", String(n)).replace("{N}", String(T - P)).replace("{k}", String(P + n));
  }
  slider.addEventListener("input", function () { setStep(Number(slider.value)); render(); });
  if (P < T) {
    slider.max = String(T - P);
    setStep(T - P);
    document.getElementById("step-control").classList.remove("hidden");
    document.getElementById("token-legend").classList.remove("hidden");
    document.getElementById("legend-prompt").textContent = words.prompt;
    document.getElementById("legend-generated").textContent = words.generated;
  }
  if (data.allowed) {
    document.getElementById("mask-legend").classList.remove("hidden");
    document.getElementById("legend-masked").textContent = words.not_allowed;
  }
  document.getElementById("sink-note").textContent = words.sink_note;

  /* ---- neuron view: q, k and q·k per dimension for one query/key pair */
  var neuronQuery = document.getElementById("neuron-query");
  var neuronKey = document.getElementById("neuron-key");
  function neuronPair() {
    if (!state.pair) {
      var q = Math.min(state.visible, T) - 1, best = 0;
      for (var k = 0; k < S; k++) {
        if (shows(q, k) && weightsShown[q * S + k] > weightsShown[q * S + best]) { best = k; }
      }
      state.pair = [q, best];
    }
    return state.pair;
  }
  function neuronAt(layer, head, q, k) {
    var at = data.neuron.layers.indexOf(layer);
    if (at < 0) { return null; }
    var D = data.neuron.D, KV = data.neuron.kv_heads, kv = kvOf(head);
    var qBase = ((at * H + head) * T + q) * D, kBase = ((at * KV + kv) * S + k) * D;
    var qs = [], ks = [], products = [], dot = 0;
    for (var d = 0; d < D; d++) {
      qs.push(neuron.q[qBase + d]); ks.push(neuron.k[kBase + d]);
      products.push(qs[d] * ks[d]); dot += products[d];
    }
    var scale = data.neuron.scales[layer];
    return {query: q, key: k, q: qs, k: ks, products: products, dot: dot, scale: scale,
            logit: dot * scale};
  }
  /* The scores of a whole row (null where the query may not attend), from q and k. */
  function rowLogits(layer, head, q) {
    var out = [];
    for (var k = 0; k < S; k++) {
      var one = allowedAt(q, k) ? neuronAt(layer, head, q, k) : null;
      out.push(one ? one.logit : null);
    }
    return out;
  }
  function renderNeuron() {
    if (!neuron) { return; }
    var pair = neuronPair(), one = neuronAt(state.layer, state.head, pair[0], pair[1]);
    neuronQuery.value = String(pair[0]); neuronKey.value = String(pair[1]);
    var target = document.getElementById("neuron-canvas"), summary = document.getElementById("neuron-sum");
    root.dataset.neuron = pair[0] + "," + pair[1];
    if (!one) {
      target.width = 0; target.height = 0; summary.textContent = words.neuron_missing;
      return;
    }
    var D = one.q.length, bar = Math.max(2, Math.min(12, Math.floor(480 / D)));
    var band = 46, top = 0;
    one.q.concat(one.k).forEach(function (v) { top = Math.max(top, Math.abs(v)); });
    var topProduct = 0;
    one.products.forEach(function (v) { topProduct = Math.max(topProduct, Math.abs(v)); });
    target.width = D * bar + 40; target.height = 3 * band;
    var context = target.getContext("2d");
    context.clearRect(0, 0, target.width, target.height);
    context.font = "11px system-ui, sans-serif"; context.textBaseline = "middle";
    [[words.neuron_q, one.q, top], [words.neuron_k, one.k, top],
     [words.neuron_qk, one.products, topProduct]].forEach(function (row, r) {
      var mid = r * band + band / 2;
      context.fillStyle = "#1d2433"; context.fillText(row[0], 0, mid);
      context.fillStyle = "#dde1ea"; context.fillRect(36, mid, D * bar, 1);
      row[1].forEach(function (v, d) {
        var h = (row[2] ? v / row[2] : 0) * (band / 2 - 3);
        context.fillStyle = v >= 0 ? "#1f5fbf" : "#c8691c";
        context.fillRect(36 + d * bar, h >= 0 ? mid - h : mid, Math.max(1, bar - 1), Math.abs(h));
      });
    });
    summary.textContent = data.tokens[pair[0]] + " \u2192 " + data.key_tokens[pair[1]] + ": " +
      words.neuron_sum.replace("{dot}", one.dot.toFixed(4))
        .replace("{scale}", one.scale.toPrecision(4)).replace("{logit}", one.logit.toFixed(4))
        .replace("{weight}", allowedAt(pair[0], pair[1]) ?
                 weightsShown[pair[0] * S + pair[1]].toFixed(digits) : words.not_allowed);
  }
  if (data.neuron) {
    document.getElementById("neuron-view").classList.remove("hidden");
    document.querySelector("label[for='neuron-query']").textContent = words.neuron_query;
    document.querySelector("label[for='neuron-key']").textContent = words.neuron_key;
    data.tokens.forEach(function (label, q) {
      var option = el("option", "", q + ": " + label); option.value = String(q);
      neuronQuery.appendChild(option);
    });
    data.key_tokens.forEach(function (label, k) {
      var option = el("option", "", k + ": " + label); option.value = String(k);
      neuronKey.appendChild(option);
    });
    [neuronQuery, neuronKey].forEach(function (select) {
      select.addEventListener("change", function () {
        state.pair = [Number(neuronQuery.value), Number(neuronKey.value)]; renderNeuron();
      });
    });
  }

  /* ---- PNG of the shown view: drawn here, saved by the browser, nothing sent anywhere */
  function exportCanvas() {
    var margin = SHOW_LABELS ? 90 : 10, head = 28, foot = 30;
    var out = document.createElement("canvas");
    out.width = Math.max(canvas.width + margin + 10, 360);
    out.height = canvas.height + head + foot + (SHOW_LABELS ? 60 : 0);
    var context = out.getContext("2d");
    context.fillStyle = "#ffffff"; context.fillRect(0, 0, out.width, out.height);
    context.fillStyle = "#1d2433"; context.font = "13px system-ui, sans-serif";
    context.textBaseline = "middle";
    context.fillText(document.getElementById("view-title").textContent + " \u2014 " +
      layerName(state.layer) + " \u00b7 " + headName(state.head) + " \u00b7 " +
      (state.measure === "norms" ? words.measure_norms : words.measure_weights), 6, 14);
    var y0 = head + (SHOW_LABELS ? 60 : 0);
    if (SHOW_LABELS) {
      context.font = "11px system-ui, sans-serif";
      context.save();
      data.key_tokens.forEach(function (label, k) {
        context.save();
        context.translate(margin + (k + 0.5) * CELL, y0 - 4);
        context.rotate(-Math.PI / 3); context.fillText(label.slice(0, 10), 0, 0);
        context.restore();
      });
      context.textAlign = "right";
      data.tokens.forEach(function (label, q) {
        context.fillText(label.slice(0, 12), margin - 4, y0 + (q + 0.5) * CELL);
      });
      context.restore();
    }
    context.drawImage(canvas, margin, y0);
    var bar = document.getElementById("heatmap-scale");
    context.drawImage(bar, margin, y0 + canvas.height + 10);
    context.fillStyle = "#5b6478"; context.font = "11px system-ui, sans-serif";
    context.fillText("0", margin - 10, y0 + canvas.height + 15);
    context.fillText(document.getElementById("heatmap-scale-high").textContent,
                     margin + bar.width + 6, y0 + canvas.height + 15);
    return out;
  }
  document.getElementById("export-png").addEventListener("click", function () {
    if (!shown) { return; }
    exportCanvas().toBlob(function (blob) {
      var link = el("a");
      link.href = URL.createObjectURL(blob);
      link.download = "attention-layer" + data.layer_numbers[state.layer] + "-head" +
        data.head_numbers[state.head] + ".png";
      document.body.appendChild(link); link.click(); link.remove();
      setTimeout(function () { URL.revokeObjectURL(link.href); }, 1000);
    }, "image/png");
  });

  /* ---- inside a notebook's iframe: tell the notebook how tall the page is */
  var framed = window.parent !== window;
  if (framed) { document.body.classList.add("framed"); }
  function fitFrame() {
    if (!framed) { return; }
    var height = Math.ceil(document.getElementById("attnlab-view").getBoundingClientRect().height);
    window.parent.postMessage({type: "attnlab-height", height: height + 4}, "*");
  }
  if (framed && window.ResizeObserver) { new ResizeObserver(fitFrame).observe(root); }

  /* For scripts and tests: the weights of any head as the page decoded them. */
  root.attnlab = {
    head: function (layer, head) {
      return Array.from(headInto(store, layer * H + head, new Float32Array(T * S)));
    },
    shown: function () { return Array.from(shown); },
    neuron: function (layer, head, q, k) { return neuronAt(layer, head, q, k); },
    rowLogits: function (layer, head, q) { return rowLogits(layer, head, q); },
    png: function () { return exportCanvas().toDataURL("image/png"); }
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
  if (data.allowed) {
    pending.push(inflate({data: data.allowed}).then(function (buffer) {
      allowedBits = new Uint8Array(buffer);
    }));
  }
  if (data.value_norms) {
    pending.push(floats(data.value_norms).then(function (values) { norms = values; }));
    document.getElementById("measure-control").classList.remove("hidden");
    document.getElementById("norms-note").classList.remove("hidden");
    document.getElementById("norms-note").textContent = words.norms_note;
  }
  if (data.segments) { document.getElementById("segment-control").classList.remove("hidden"); }
  if (data.neuron) {
    pending.push(Promise.all([floats(data.neuron.q), floats(data.neuron.k)]).then(
      function (pair) { neuron = {q: pair[0], k: pair[1]}; }));
  }
  if (digits < 4) { document.getElementById("precision-note").textContent = words.precision_8bit; }
  Promise.all(pending).then(function () {
    statusLine.textContent = "";
    layerSelect.value = String(state.layer); headSelect.value = String(state.head);
    render(); renderRollout(); fitFrame();
    root.dataset.ready = "1";
    drawThumbnails();
  }).catch(function (error) {
    statusLine.textContent = words.decode_error + " (" + error + ")";
    root.dataset.ready = "error";
  });
})();
