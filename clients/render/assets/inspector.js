// xattn inspector: the page's state, events (embedded or live over SSE), controls and API.
"use strict";

const CONFIG = JSON.parse(document.getElementById("xattn-data").textContent);
const INFO = CONFIG.info, FRAMES = 1500, FPS = INFO.frames_per_second || 50;
const canvas = document.getElementById("heatmap");
const audio = document.getElementById("audio");
const tooltip = document.getElementById("tooltip");
const $ = (id) => document.getElementById(id);
const S = {
  windows: [], segments: [], current: 0, view: "mean", normalize: true, showWords: true,
  v0: 0, v1: FRAMES, selected: -1, hoverRow: -1, hover: null, done: false, error: null,
  text: "", events: 0, pending: false, pickedWindow: false, interim: "",
  history: [],  // [ms, rows drawn] per draw: how the heatmap grew
};

const HALF = (() => {  // float16 bits -> float32
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    t[h] = e === 0 ? s * 2 ** -14 * (f / 1024) : e === 31 ? (f ? NaN : s * Infinity)
      : s * 2 ** (e - 15) * (1 + f / 1024);
  }
  return t;
})();
function decodeRows(b64, dtype) {
  const bin = atob(b64), bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  if (dtype === "f32") return new Float32Array(bytes.buffer);
  const u16 = new Uint16Array(bytes.buffer), out = new Float32Array(u16.length);
  for (let i = 0; i < u16.length; i++) out[i] = HALF[u16[i]];
  return out;
}

// Views: the alignment-head mean, each layer's mean, each head (rows as the stream sent them).
const HEADS = CONFIG.heads;  // [[layer, head], ...] per row index, or null: one mean row
const VIEWS = (() => {
  if (!HEADS) return [{ id: "mean", name: "alignment-head mean", rows: [0] }];
  const key = (h) => `${h[0]},${h[1]}`, wanted = new Set(INFO.alignment_heads.map(key));
  let picked = HEADS.map((h, i) => (wanted.has(key(h)) ? i : -1)).filter((i) => i >= 0);
  if (!picked.length) picked = HEADS.map((h, i) => i);
  const views = [{ id: "mean", name: `alignment-head mean (${picked.length} heads)`, rows: picked }];
  const layers = [...new Set(HEADS.map((h) => h[0]))];
  for (const l of layers) {
    const rows = HEADS.map((h, i) => (h[0] === l ? i : -1)).filter((i) => i >= 0);
    views.push({ id: `L${l}`, name: `layer ${l} · mean of its ${rows.length} heads`, rows });
  }
  HEADS.forEach((h, i) => views.push({
    id: `L${h[0]}H${h[1]}`, rows: [i],
    name: `layer ${h[0]} · head ${h[1]}${wanted.has(key(h)) ? " (alignment head)" : ""}`,
  }));
  return views;
})();
function viewRows(id) { return (VIEWS.find((v) => v.id === id) || VIEWS[0]).rows; }

function currentWindow() { return S.windows[S.current] || null; }
function windowWords(win) {
  return S.segments.filter((s) => s.window === win.window).flatMap((s) => s.words || []);
}
function tokenLabel(t) {
  if (t.kind === "timestamp") return `<|${(t.timestamp || 0).toFixed(2)}|>`;
  if (t.kind === "eot") return "<|eot|>";
  return t.text === "" ? "·" : t.text;
}

// Words -> tokens by their non-space characters; then each token's start (where to play).
function attachWords(win) {
  const words = windowWords(win), owner = [];
  words.forEach((w, i) => { for (const c of w.word) if (c.trim()) owner.push(i); });
  let pos = 0;
  for (const t of win.tokens) {
    t.word = null;
    if (t.kind !== "text" || !words.length || pos >= owner.length) continue;
    t.word = owner[pos];
    pos += [...t.text].filter((c) => c.trim()).length;
  }
  win.tokens.forEach((t) => {
    t.start = t.word != null ? words[t.word].start
      : t.kind === "timestamp" ? frameTime(win, t.timestamp * FPS) : frameTime(win, t.peakFrame);
  });
}

// The argmax of a token's alignment-head mean over the window's real frames.
function peakFrame(rows, numFrames) {
  const idx = VIEWS[0].rows;
  let best = 0, bestValue = -1;
  for (let f = 0; f < Math.max(1, Math.min(FRAMES, numFrames)); f++) {
    let v = 0;
    for (const h of idx) v += rows[h * FRAMES + f];
    if (v > bestValue) { bestValue = v; best = f; }
  }
  return best;
}

// A window's frame on the file's clock: through its vad_filter clock ([first, count, start]
// pieces of joined speech), else offset + frame / 50.
function frameTime(win, frame) {
  for (const [first, count, start] of win.clock || []) {
    if (frame >= first && frame < first + count) return start + (frame - first) / FPS;
  }
  return win.offset + frame / FPS;
}

function handle(ev, quiet) {
  S.events++;
  if (ev.type === "window_start") {
    const known = S.windows.find((w) => w.window === ev.window);
    if (known) {  // a live window widening as audio arrives
      const i = S.windows.indexOf(known), fitted = i === S.current && isFit();
      known.numFrames = ev.num_frames; known.version++;
      if (fitted) fit();
      if (!quiet) refresh();
      return;
    }
    S.windows.push({ window: ev.window, offset: ev.offset, numFrames: ev.num_frames,
      clock: ev.clock || [], language: ev.language, tokens: [], version: 0 });
    if (S.windows.length === 1 || (CONFIG.live && !S.pickedWindow)) {
      S.current = S.windows.length - 1; S.selected = -1; fit();
    }
  } else if (ev.type === "token") {
    const win = S.windows.find((w) => w.window === ev.window);
    if (!win) return;
    const t = { ...ev, rows: decodeRows(ev.data, ev.dtype), label: tokenLabel(ev), word: null };
    delete t.data;
    t.peakFrame = ev.peak_time != null ? Math.round((ev.peak_time - win.offset) * FPS)
      : peakFrame(t.rows, win.numFrames);
    win.tokens.push(t); win.version++;
  } else if (ev.type === "discarded") {
    const win = S.windows.find((w) => w.window === ev.window);
    if (win) { win.tokens = []; win.version++; }
    note(`window ${ev.window}: attempt at T=${ev.temperature} rejected (${ev.reason})`);
  } else if (ev.type === "interim") {  // live: the guess after the finals, replaced
    S.interim = ev.text;
  } else if (ev.type === "segment") {
    S.segments.push(ev);
  } else if (ev.type === "done") {
    S.done = true; S.text = ev.text;
    if (ev.segments) S.segments = ev.segments;
  } else if (ev.type === "error") {
    S.error = `${ev.code}: ${ev.message}`; S.done = true;
  }
  if (quiet) return;
  S.windows.forEach((w) => { if (w.tokens.length) attachWords(w); });
  refresh();
}

function note(text) { const d = document.createElement("div"); d.textContent = text; $("notes").append(d); }

function refresh() {
  renderWindowSelect(); renderTranscript(); renderShapes(); renderStatus(); schedule();
}
function schedule() { if (!S.pending) { S.pending = true; requestAnimationFrame(draw); } }

function renderStatus() {
  const n = S.windows.reduce((a, w) => a + w.tokens.length, 0);
  $("status").textContent = S.error ? `server error ${S.error}`
    : S.done ? `done · ${n} tokens in ${S.windows.length} window(s)`
    : `streaming… ${n} tokens so far`;
  $("status").className = S.error ? "error" : S.done ? "done" : "live";
  document.body.dataset.done = String(S.done);
}

function renderWindowSelect() {
  const sel = $("window");
  if (sel.options.length === S.windows.length) return;
  sel.replaceChildren(...S.windows.map((w, i) => new Option(
    `window ${w.window} (${w.offset.toFixed(0)}–${(w.offset + w.numFrames / FPS).toFixed(1)} s)`, i)));
  sel.value = String(S.current);
  sel.parentElement.hidden = S.windows.length < 2;
}

function renderTranscript() {
  const box = $("transcript"), win = currentWindow();
  box.replaceChildren();
  if (win) win.tokens.forEach((t, r) => {
    const span = document.createElement("span");
    span.className = `tok ${t.kind}${r === S.selected ? " selected" : ""}`;
    span.textContent = t.kind === "text" ? t.text : tokenLabel(t);
    span.dataset.row = String(r); span.dataset.index = String(t.index);
    span.title = `#${t.index} id ${t.id} · p=${Math.exp(t.logprob).toFixed(2)} · ` +
      `starts ${t.start.toFixed(2)} s`;
    span.style.setProperty("--conf", String(Math.exp(t.logprob)));
    span.onclick = () => playToken(r);
    box.append(span);
  });
  if (S.interim && (!win || S.current === S.windows.length - 1)) {  // live: before a final too
    const span = document.createElement("span");
    span.className = "interim"; span.id = "interim"; span.textContent = S.interim;
    span.title = "interim: not final yet, replaced by the next result";
    box.append(span);
  }
}

function playToken(r) {
  const t = currentWindow().tokens[r];
  S.selected = r;
  audio.currentTime = t.start;
  audio.play().catch(() => {});  // a browser may refuse without a gesture; the seek holds
  renderTranscript(); schedule();
}

function renderShapes() {
  const win = currentWindow(), T = win ? win.tokens.length : 0;
  const d = INFO.n_text_state, H = INFO.n_text_head, L = INFO.n_text_layer, dk = d / H;
  const A = INFO.n_audio_ctx, mb = (x) => `${(x / 2 ** 20).toFixed(1)} MiB`;
  $("shapes").innerHTML = `
  <div><b>${INFO.name}</b>: decoder d_model = ${d}, ${H} heads × ${L} layers, d_k = ${d} / ${H} = ${dk};
  encoder: ${A} frames × ${INFO.n_audio_state}. This window: T = <b>${T}</b> streamed tokens.</div>
  <table>
  <tr><td>X</td><td>T × d_model</td><td>${T} × ${d}</td><td>decoder states, one row per token</td></tr>
  <tr><td>Q = X W<sub>q</sub></td><td>T × d_k per head</td><td>${T} × ${dk}</td><td>× ${H} heads × ${L} layers</td></tr>
  <tr><td>K = E W<sub>k</sub>, V = E W<sub>v</sub></td><td>${A} × d_k per head</td><td>${A} × ${dk}</td>
    <td>from the ${A} encoder frames E (${A} × ${INFO.n_audio_state})</td></tr>
  <tr><td>weights = softmax(Q K<sup>T</sup> / √${dk})</td><td>T × ${A}</td><td>${T} × ${A}</td>
    <td>per head; <b>this heatmap</b> (one head or a mean); each row sums to 1</td></tr>
  <tr><td>out = weights V</td><td>T × d_k → concat</td><td>${T} × ${d}</td><td>${H} heads joined</td></tr>
  </table>
  <div>KV cache, per layer: <b>self-attention</b> K and V grow one row per token (now ${T} × ${d}
  each; all ${L} layers: ${mb(2 * L * T * d * 4)} in fp32); <b>cross-attention</b> K and V stay
  ${A} × ${d} each, computed once per window from the encoder output (all ${L} layers:
  ${mb(2 * L * A * d * 4)} in fp32).</div>`;
}

function fitEnd(win) { return win ? Math.min(FRAMES, Math.max(50, win.numFrames + 25)) : FRAMES; }
function fit() { S.v0 = 0; S.v1 = fitEnd(currentWindow()); }
function isFit() { return S.v0 === 0 && S.v1 === fitEnd(currentWindow()); }
function zoom(factor, centerFrame) {
  const c = centerFrame ?? (S.v0 + S.v1) / 2;
  const span = Math.min(FRAMES, Math.max(20, (S.v1 - S.v0) / factor));
  S.v0 = Math.max(0, Math.min(FRAMES - span, c - (c - S.v0) / ((S.v1 - S.v0) / span)));
  S.v1 = S.v0 + span; schedule();
}
function select(id) {
  if (!VIEWS.some((v) => v.id === id)) throw new Error(`unknown view ${id}`);
  S.view = id; $("view").value = id;
  refresh();
}
function selectWindow(i) { S.current = i; S.pickedWindow = true; S.selected = -1; fit(); refresh(); }

function showHover(e) {
  const cell = cellAt(e.clientX, e.clientY), win = currentWindow();
  S.hoverRow = cell ? cell.row : -1;
  if (!cell || !win) { tooltip.hidden = true; S.hover = null; schedule(); return; }
  const t = win.tokens[cell.row], m = viewMatrix(win), w = m[cell.row * FRAMES + cell.frame];
  const time = frameTime(win, cell.frame);
  S.hover = { row: cell.row, index: t.index, token: t.label, frame: cell.frame, time, weight: w };
  tooltip.hidden = false;
  tooltip.textContent = `“${t.label}” (#${t.index}) · ${time.toFixed(2)} s (frame ${cell.frame})` +
    ` · weight ${w.toFixed(4)}${cell.frame >= win.numFrames ? " · padding" : ""}`;
  Object.assign(tooltip.dataset, { token: t.label, tokenIndex: t.index, row: cell.row,
    frame: cell.frame, time: time.toFixed(2), weight: w.toFixed(5) });
  tooltip.style.left = `${Math.min(e.clientX + 14, innerWidth - tooltip.offsetWidth - 8)}px`;
  tooltip.style.top = `${e.clientY + 16}px`;
  schedule();
}

let drag = null;
canvas.addEventListener("mousemove", (e) => {
  if (drag) {
    const g = geometry(currentWindow()), df = ((drag.x - e.clientX) / g.plotW) * (S.v1 - S.v0);
    const span = S.v1 - S.v0;
    S.v0 = Math.max(0, Math.min(FRAMES - span, drag.v0 + df)); S.v1 = S.v0 + span;
    if (Math.abs(drag.x - e.clientX) > 3) drag.moved = true;
  }
  showHover(e);
});
canvas.addEventListener("mouseleave", () => { tooltip.hidden = true; S.hoverRow = -1; schedule(); });
canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, v0: S.v0, moved: false }; });
window.addEventListener("mouseup", (e) => {
  const d = drag; drag = null;
  if (!d || d.moved) return;
  const cell = cellAt(e.clientX, e.clientY);
  if (cell) { S.selected = cell.row; audio.currentTime = frameTime(currentWindow(), cell.frame); refresh(); }
});
canvas.addEventListener("wheel", (e) => {
  e.preventDefault();
  const cell = cellAt(e.clientX, e.clientY);
  zoom(e.deltaY < 0 ? 1.25 : 0.8, cell ? cell.frame : undefined);
}, { passive: false });
$("zoom-in").onclick = () => zoom(1.5);
$("zoom-out").onclick = () => zoom(1 / 1.5);
$("zoom-fit").onclick = () => { fit(); schedule(); };
$("zoom-all").onclick = () => { S.v0 = 0; S.v1 = FRAMES; schedule(); };
$("normalize").onchange = (e) => { S.normalize = e.target.checked; schedule(); };
$("words").onchange = (e) => { S.showWords = e.target.checked; schedule(); };
$("view").replaceChildren(...VIEWS.map((v) => new Option(v.name, v.id)));
$("view").onchange = (e) => select(e.target.value);
$("window").onchange = (e) => selectWindow(Number(e.target.value));
window.addEventListener("resize", schedule);
for (const kind of ["timeupdate", "seeked", "play", "pause"]) audio.addEventListener(kind, schedule);
(function tick() { if (!audio.paused) schedule(); requestAnimationFrame(tick); })();

window.xattn = {
  get rows() { const w = currentWindow(); return w ? w.tokens.length : 0; },
  get tokens() {
    const w = currentWindow();
    return w ? w.tokens.map(({ rows, ...t }) => ({ ...t, peakTime: frameTime(w, t.peakFrame) })) : [];
  },
  get windows() { return S.windows.length; },
  get allRows() { return S.windows.reduce((a, w) => a + w.tokens.length, 0); },
  get interim() { return S.interim; },
  get views() { return VIEWS.map((v) => v.id); },
  get view() { return S.view; },
  get hover() { return S.hover; },
  get done() { return S.done; },
  get error() { return S.error; },
  get text() { return S.text; },
  get cursorTime() { return audio.currentTime; },
  get range() { return [S.v0, S.v1]; },
  get history() { return S.history.slice(); },
  get events() { return S.events; },
  info: INFO, heads: HEADS, select, selectWindow, zoom, fit: () => { fit(); schedule(); },
  cellCenter, cellAt, playToken, draw,
};

$("audio-name").textContent = CONFIG.audio ? CONFIG.audio.name : "";
if (CONFIG.audio) audio.src = `data:${CONFIG.audio.mime};base64,${CONFIG.audio.b64}`;
for (const ev of CONFIG.events) handle(ev, true);
S.windows.forEach((w) => { if (w.tokens.length) attachWords(w); });
if (CONFIG.live) {
  const source = new EventSource(CONFIG.live);
  source.onmessage = (m) => {
    const ev = JSON.parse(m.data);
    handle(ev);
    if (ev.type === "done" || ev.type === "error") source.close();
  };
}
refresh();
