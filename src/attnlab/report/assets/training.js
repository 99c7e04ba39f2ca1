"use strict";
(function () {
  const data = JSON.parse(document.getElementById("training-data").textContent);
  const words = data.words;
  const [K, L, H, T] = data.shape;
  const slider = document.getElementById("step-slider");
  const stepOut = document.getElementById("step-value");
  const layerSel = document.getElementById("layer-select");
  const headSel = document.getElementById("head-select");
  const play = document.getElementById("play");
  const heatmap = document.getElementById("heatmap");
  const scores = document.getElementById("scores");
  const lossLine = document.getElementById("loss-line");
  const mapTitle = document.getElementById("map-title");

  function option(select, value, label) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = label;
    select.appendChild(o);
  }
  for (let l = 0; l < L; l++) option(layerSel, l, String(l + 1));
  for (let h = 0; h < H; h++) option(headSel, h, String(h + 1));
  layerSel.value = String(data.start[0]);
  headSel.value = String(data.start[1]);
  slider.max = String(K - 1);
  slider.value = String(K - 1);

  function cell(tag, text, cls) {
    const c = document.createElement(tag);
    if (text !== null) c.textContent = text;
    if (cls) c.className = cls;
    return c;
  }

  function drawHeatmap(k, l, h) {
    heatmap.replaceChildren();
    const head = document.createElement("thead");
    const top = document.createElement("tr");
    top.appendChild(cell("th", "", null));
    for (let j = 0; j < T; j++) top.appendChild(cell("th", data.tokens[j], null));
    head.appendChild(top);
    heatmap.appendChild(head);
    const body = document.createElement("tbody");
    const rows = data.weights[k][l][h];
    for (let i = 0; i < T; i++) {
      const tr = document.createElement("tr");
      tr.appendChild(cell("th", data.tokens[i], null));
      for (let j = 0; j < T; j++) {
        const w = rows[i][j] / 1000;
        const td = cell("td", null, data.period && i >= data.period && j === i - data.period + 1
          ? "stripe" : null);
        const shade = Math.round(255 * (1 - w));
        td.style.backgroundColor = "rgb(" + shade + "," + shade + ",255)";
        td.title = data.tokens[i] + " → " + data.tokens[j] + ": " + w.toFixed(3);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    heatmap.appendChild(body);
    mapTitle.textContent = words.heatmap + " · " + words.layer + " " + (l + 1) + " · " +
      words.head + " " + (h + 1);
  }

  function drawScores(k, l, h) {
    scores.replaceChildren();
    const names = Object.keys(data.head_scores);
    const head = document.createElement("tr");
    head.appendChild(cell("th", words.head, null));
    for (const name of names) head.appendChild(cell("th", words.detectors[name] || name, null));
    scores.appendChild(head);
    for (let hh = 0; hh < H; hh++) {
      const tr = document.createElement("tr");
      tr.appendChild(cell("th", (l + 1) + "·" + (hh + 1), null));
      for (const name of names) {
        const layer = data.head_scores[name][k][l];
        const best = Math.max.apply(null, layer);
        tr.appendChild(cell("td", layer[hh].toFixed(3), layer[hh] === best ? "best" : null));
      }
      scores.appendChild(tr);
    }
    const loss = data.heldout_loss[k];
    lossLine.textContent = words.heldout_loss + ": " + (loss === null ? "–" : loss.toFixed(4));
  }

  function draw() {
    const k = Number(slider.value), l = Number(layerSel.value), h = Number(headSel.value);
    stepOut.textContent = words.step + " " + data.steps[k] + " / " + data.steps[K - 1];
    drawHeatmap(k, l, h);
    drawScores(k, l, h);
  }

  let timer = null;
  play.addEventListener("click", function () {
    if (timer !== null) { clearInterval(timer); timer = null; play.textContent = words.play; return; }
    if (Number(slider.value) === K - 1) slider.value = "0";
    play.textContent = words.pause;
    timer = setInterval(function () {
      const next = Number(slider.value) + 1;
      if (next >= K) { clearInterval(timer); timer = null; play.textContent = words.play; return; }
      slider.value = String(next);
      draw();
    }, 250);
  });
  slider.addEventListener("input", draw);
  layerSel.addEventListener("change", draw);
  headSel.addEventListener("change", draw);
  draw();
})();
