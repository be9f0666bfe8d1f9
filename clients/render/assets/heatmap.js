// xattn inspector: the heatmap canvas (tokens × frames), its overlays and hit tests.
// Shares the page script's scope (inspector.js follows it inside one function).
"use strict";

const STOPS = ("000004,0b0724,210c4a,3d0965,57106e,71196e,8a226a,a32c61,bc3754,d24644," +
  "e45a31,f1731d,f98e09,fcac11,f9cb35,f2ea69,fcffa4").split(",");
const LUT = (() => {  // inferno, 256 × RGB
  const rgb = STOPS.map((h) => [0, 2, 4].map((i) => parseInt(h.slice(i, i + 2), 16)));
  const lut = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) {
    const x = (i / 255) * (rgb.length - 1), k = Math.min(rgb.length - 2, Math.floor(x));
    const f = x - k;
    for (let c = 0; c < 3; c++) lut[i * 3 + c] = rgb[k][c] * (1 - f) + rgb[k + 1][c] * f;
  }
  return lut;
})();
const G = { label: 150, top: 48, bottom: 34, right: 14 };  // canvas margins, CSS px

function rowHeight(n) { return Math.max(12, Math.min(24, Math.floor(560 / Math.max(1, n)))); }

// The current window's matrix in the current view: Float32Array [n × FRAMES], cached.
function viewMatrix(win) {
  const key = `${S.view}|${win.tokens.length}|${win.version}`;
  if (win.cache && win.cache.key === key) return win.cache.m;
  const idx = viewRows(S.view), n = win.tokens.length, m = new Float32Array(n * FRAMES);
  win.tokens.forEach((t, r) => {
    const out = m.subarray(r * FRAMES, (r + 1) * FRAMES);
    for (const h of idx) {
      const src = t.rows.subarray(h * FRAMES, (h + 1) * FRAMES);
      for (let f = 0; f < FRAMES; f++) out[f] += src[f];
    }
    for (let f = 0; f < FRAMES; f++) out[f] /= idx.length;
  });
  win.cache = { key, m };
  return m;
}

// An offscreen FRAMES × n image of the matrix (rows scaled to their max, or one global max).
function matrixImage(win) {
  const m = viewMatrix(win), n = win.tokens.length;
  const key = `${S.view}|${n}|${win.version}|${S.normalize}`;
  if (win.image && win.image.key === key) return win.image.canvas;
  const off = document.createElement("canvas");
  off.width = FRAMES; off.height = Math.max(1, n);
  const ctx = off.getContext("2d"), img = ctx.createImageData(FRAMES, Math.max(1, n));
  const real = Math.max(1, win.numFrames);
  let global = 1e-12;
  for (let i = 0; i < m.length; i++) if (i % FRAMES < real && m[i] > global) global = m[i];
  for (let r = 0; r < n; r++) {
    let top = global;
    if (S.normalize) {
      top = 1e-12;
      for (let f = 0; f < real; f++) top = Math.max(top, m[r * FRAMES + f]);
    }
    for (let f = 0; f < FRAMES; f++) {
      const v = Math.min(255, Math.max(0, Math.round((m[r * FRAMES + f] / top) * 255)));
      const o = (r * FRAMES + f) * 4;
      img.data[o] = LUT[v * 3]; img.data[o + 1] = LUT[v * 3 + 1]; img.data[o + 2] = LUT[v * 3 + 2];
      img.data[o + 3] = 255;
    }
  }
  ctx.putImageData(img, 0, 0);
  win.image = { key, canvas: off };
  return off;
}

function geometry(win) {
  const n = win.tokens.length, rh = rowHeight(n);
  const width = Math.max(480, canvas.parentElement.clientWidth);
  const plotW = width - G.label - G.right;
  return { n, rh, width, height: G.top + Math.max(1, n) * rh + G.bottom, plotW };
}
function frameX(g, frame) { return G.label + ((frame - S.v0) / (S.v1 - S.v0)) * g.plotW; }

function draw() {
  S.pending = false;
  const win = currentWindow();
  if (!win) return;
  const g = geometry(win), dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(g.width * dpr) || canvas.height !== Math.round(g.height * dpr)) {
    canvas.width = Math.round(g.width * dpr); canvas.height = Math.round(g.height * dpr);
    canvas.style.width = `${g.width}px`; canvas.style.height = `${g.height}px`;
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.fillStyle = "#15161c"; ctx.fillRect(0, 0, g.width, g.height);
  if (g.n) {
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(matrixImage(win), S.v0, 0, S.v1 - S.v0, g.n,
      G.label, G.top, g.plotW, g.n * g.rh);
  }
  drawPadding(ctx, g, win);
  drawSkips(ctx, g, win);
  if (S.showWords) drawWordPath(ctx, g, win);
  drawPeaks(ctx, g, win);
  drawLabels(ctx, g, win);
  drawAxis(ctx, g, win);
  drawCursor(ctx, g, win);
  canvas.dataset.rows = String(g.n);
  if (S.history.length < 10000) S.history.push([Math.round(performance.now()), g.n]);
  canvas.dataset.view = S.view;
  canvas.dataset.window = String(win.window);
}

function drawPadding(ctx, g, win) {
  const x = frameX(g, win.numFrames), x1 = G.label + g.plotW;
  if (x >= x1) return;
  const x0 = Math.max(G.label, x);
  ctx.fillStyle = "rgba(120,120,130,0.45)";
  ctx.fillRect(x0, G.top, x1 - x0, g.n * g.rh);
  if (x >= G.label) {
    ctx.strokeStyle = "#fff"; ctx.setLineDash([5, 4]); ctx.lineWidth = 1.5;
    ctx.beginPath(); ctx.moveTo(x, G.top - 6); ctx.lineTo(x, G.top + g.n * g.rh); ctx.stroke();
    ctx.setLineDash([]);
    ctx.fillStyle = "#ddd"; ctx.font = "10px sans-serif"; ctx.textAlign = "left";
    ctx.fillText("end of audio", Math.min(x + 4, x1 - 64), G.top - 4);
  }
}

// vad_filter: the window is speech joined back to back; a grey band where a skipped (silent)
// stretch of the file lies between two of its frames, labelled with its length.
function drawSkips(ctx, g, win) {
  const clock = win.clock || [];
  for (let i = 1; i < clock.length; i++) {
    const [first, , start] = clock[i], [pf, pc, ps] = clock[i - 1];
    const x = frameX(g, first), gap = start - (ps + pc / FPS);
    if (x < G.label || x > G.label + g.plotW) continue;
    ctx.fillStyle = "rgba(158,158,158,0.9)";
    ctx.fillRect(x - 2, G.top - 6, 4, g.n * g.rh + 6);
    ctx.fillStyle = "#ddd"; ctx.font = "10px sans-serif"; ctx.textAlign = "center";
    ctx.fillText(`skipped ${gap.toFixed(1)} s`, x, G.top - 8);
  }
}

function drawWordPath(ctx, g, win) {
  const words = windowWords(win);
  if (!words.length) return;
  ctx.strokeStyle = "#38e8ff"; ctx.lineWidth = 1.5; ctx.font = "11px sans-serif";
  ctx.textAlign = "center";
  const lastEnd = [-1e9, -1e9];  // two staggered lines of word labels
  win.tokens.forEach((t, r) => {
    if (t.word == null) return;
    const w = words[t.word];
    const a = frameX(g, (w.start - win.offset) * FPS), b = frameX(g, (w.end - win.offset) * FPS);
    ctx.strokeRect(a, G.top + r * g.rh + 1, Math.max(2, b - a), g.rh - 2);
  });
  words.forEach((w) => {  // words along the top, on whichever of two lines has room
    const mid = frameX(g, ((w.start + w.end) / 2 - win.offset) * FPS);
    const text = w.word.trim(), half = ctx.measureText(text).width / 2;
    if (mid < G.label || mid > G.label + g.plotW) return;
    const line = [0, 1].find((k) => mid - half > lastEnd[k] + 4);
    if (line === undefined) return;
    ctx.fillStyle = "#9fefff"; ctx.fillText(text, mid, G.top - 31 + line * 13);
    lastEnd[line] = mid + half;
  });
}

function drawPeaks(ctx, g, win) {
  const m = viewMatrix(win), real = Math.max(1, win.numFrames);
  ctx.fillStyle = "#00e5ff";
  for (let r = 0; r < g.n; r++) {
    let best = 0;
    for (let f = 1; f < real; f++) if (m[r * FRAMES + f] > m[r * FRAMES + best]) best = f;
    const x = frameX(g, best + 0.5);
    if (x < G.label || x > G.label + g.plotW) continue;
    ctx.beginPath(); ctx.arc(x, G.top + (r + 0.5) * g.rh, 2.2, 0, 2 * Math.PI); ctx.fill();
  }
}

function drawLabels(ctx, g, win) {
  ctx.font = `${Math.min(13, g.rh - 1)}px ui-monospace, monospace`;
  ctx.textAlign = "right"; ctx.textBaseline = "middle";
  win.tokens.forEach((t, r) => {
    const y = G.top + (r + 0.5) * g.rh;
    if (r === S.selected || r === S.hoverRow) {
      ctx.fillStyle = r === S.selected ? "rgba(255,220,80,0.25)" : "rgba(255,255,255,0.12)";
      ctx.fillRect(0, G.top + r * g.rh, G.label - 4, g.rh);
      ctx.strokeStyle = ctx.fillStyle;
      ctx.strokeRect(G.label, G.top + r * g.rh, g.plotW, g.rh);
    }
    ctx.fillStyle = t.kind === "text" ? "#e8e8ee" : "#8d8fa0";
    let label = t.label;
    while (label.length > 2 && ctx.measureText(label).width > G.label - 12) label = label.slice(0, -1);
    ctx.fillText(label, G.label - 8, y);
  });
  ctx.textBaseline = "alphabetic";
}

function drawAxis(ctx, g, win) {
  const y = G.top + g.n * g.rh, span = (S.v1 - S.v0) / FPS;
  const step = [0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10].find((s) => (g.plotW * s) / span >= 60) || 10;
  ctx.strokeStyle = "#888"; ctx.fillStyle = "#bbb"; ctx.font = "11px sans-serif";
  ctx.textAlign = "center"; ctx.lineWidth = 1;
  const first = Math.ceil(S.v0 / FPS / step) * step;
  for (let s = first; s <= S.v1 / FPS + 1e-9; s += step) {
    const x = frameX(g, s * FPS);
    ctx.beginPath(); ctx.moveTo(x, y); ctx.lineTo(x, y + 5); ctx.stroke();
    const digits = step < 0.1 ? 2 : step < 1 ? 1 : 0;
    ctx.fillText((win.offset + s).toFixed(digits), x, y + 16);
  }
  ctx.textAlign = "left";
  ctx.fillText("time (s)", 6, y + 16);
}

function drawCursor(ctx, g, win) {
  const t = audio.currentTime - win.offset;
  if (!(t >= 0 && t <= 30)) return;
  const x = frameX(g, t * FPS);
  if (x < G.label || x > G.label + g.plotW) return;
  ctx.strokeStyle = "#ff3b5c"; ctx.lineWidth = 2;
  ctx.beginPath(); ctx.moveTo(x, G.top - 4); ctx.lineTo(x, G.top + g.n * g.rh + 4); ctx.stroke();
}

// Hit test: client coordinates -> {row, frame} or null.
function cellAt(clientX, clientY) {
  const win = currentWindow();
  if (!win) return null;
  const g = geometry(win), box = canvas.getBoundingClientRect();
  const x = clientX - box.left, y = clientY - box.top;
  if (x < G.label || x > G.label + g.plotW || y < G.top || y >= G.top + g.n * g.rh) return null;
  const frame = Math.floor(S.v0 + ((x - G.label) / g.plotW) * (S.v1 - S.v0));
  return { row: Math.floor((y - G.top) / g.rh), frame: Math.min(FRAMES - 1, Math.max(0, frame)) };
}

// The client coordinates of the centre of a cell (for tests and keyboard use).
function cellCenter(row, frame) {
  const win = currentWindow(), g = geometry(win), box = canvas.getBoundingClientRect();
  return { x: box.left + frameX(g, frame + 0.5), y: box.top + G.top + (row + 0.5) * g.rh };
}
