// xattn compare page: word boxes of both sides on one axis, the word-by-word diff, and the two
// embedded inspectors kept on the same time range.
"use strict";

const DATA = JSON.parse(document.getElementById("compare-data").textContent);
const $ = (id) => document.getElementById(id);
const fmt = (t) => (t == null ? "" : t.toFixed(2));
const differing = [new Set(), new Set()];  // per side: "start|word" of words that differ
for (const p of DATA.pairs) {
  if (p.same) continue;
  if (p.a) differing[0].add(`${p.a.start}|${p.a.word}`);
  if (p.b) differing[1].add(`${p.b.start}|${p.b.word}`);
}

function drawBoxes() {
  const dur = DATA.duration;
  DATA.sides.forEach((side, k) => {
    const track = $(k ? "track-b" : "track-a");
    track.textContent = "";
    for (const w of side.words) {
      const box = document.createElement("div");
      box.className = "box" + (differing[k].has(`${w.start}|${w.word}`) ? " differs" : "");
      box.style.left = `${(100 * w.start) / dur}%`;
      box.style.width = `${Math.max(0.2, (100 * (w.end - w.start)) / dur)}%`;
      box.textContent = w.word.trim();
      box.title = `${w.word.trim()} · ${fmt(w.start)}–${fmt(w.end)} s · p ${w.probability}`;
      track.appendChild(box);
    }
  });
  const axis = $("axis");
  axis.textContent = "";
  const step = dur > 60 ? 10 : dur > 20 ? 5 : 1;
  for (let t = 0; t <= dur + 1e-9; t += step) {
    const tick = document.createElement("span");
    tick.className = "tick";
    tick.style.left = `${(100 * t) / dur}%`;
    tick.textContent = `${t}s`;
    axis.appendChild(tick);
  }
}

function drawDiff() {
  const body = $("diff").querySelector("tbody");
  for (const p of DATA.pairs) {
    const tr = document.createElement("tr");
    if (!p.same) tr.className = "differs";
    for (const w of [p.a, p.b]) {
      const td = document.createElement("td");
      td.textContent = w ? w.word.trim() : "—";
      if (!w) td.className = "missing";
      tr.appendChild(td);
    }
    for (const w of [p.a, p.b]) {
      const td = document.createElement("td");
      td.className = "time";
      td.textContent = w ? `${fmt(w.start)}–${fmt(w.end)}` : "";
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
  $("diff-count").textContent = `${DATA.differences} of ${DATA.pairs.length} differ`;
}

// Keep the two inspectors on the same time range: whichever moved last leads.
const frames = [$("frame-a"), $("frame-b")];
const api = (f) => (f.contentWindow && f.contentWindow.xattn) || null;
let last = null;
function sync() {
  const apis = frames.map(api);
  if (apis.some((x) => !x || !x.setRange)) return;
  const ranges = apis.map((x) => x.range.join(","));
  const moved = ranges.findIndex((r) => r !== last);
  if (moved >= 0) {
    const [v0, v1] = apis[moved].range;
    apis[1 - moved].setRange(v0, v1);
    last = `${v0},${v1}`;
  }
}
setInterval(sync, 100);

drawBoxes();
drawDiff();
window.xattnCompare = {
  data: DATA, frames: () => frames.map(api), sync,
  get ready() { return frames.every((f) => api(f) && api(f).done); },
};
let loaded = 0;
frames.forEach((f) => f.addEventListener("load", () => {
  const doc = f.contentDocument;  // as tall as the inspector it holds: no inner scrolling
  if (doc) f.style.height = `${doc.documentElement.scrollHeight + 4}px`;
  if (++loaded === 2) { sync(); document.body.dataset.ready = "true"; }
}));
