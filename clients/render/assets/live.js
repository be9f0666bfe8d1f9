// xattn live page (clients/bridge.py): runs inside the inspector's scope, after inspector.js.
// The microphone (getUserMedia) -> an AudioWorklet (16 kHz mono int16, 40 ms chunks) -> the
// WebSocket -> the bridge -> StreamingRecognize; the bridge sends back the inspector's own
// events (window_start, token, segment, interim, done, error), handled by `handle` above.
// After stop: the recording as a WAV for the player, words and every head's view.
const MIC = CONFIG.mic, CHUNK = 640, RATE = 16000;
const L = {
  phase: "idle",  // idle -> starting -> recording -> stopping -> done | failed
  ws: null, ctx: null, media: null, node: null, pcm: [], samples: 0,
  firstChunkAt: null, finals: [], message: "", activity: [], closed: null, flushed: false,
};

const WORKLET = `
class Pcm16 extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ratio = sampleRate / ${RATE}; this.t = 0; this.last = 0;
    this.buf = new Int16Array(${CHUNK}); this.n = 0;
    this.port.onmessage = () => {  // flush: the partial chunk, then "flushed"
      if (this.n) this.port.postMessage(this.buf.slice(0, this.n).buffer);
      this.n = 0; this.port.postMessage("flushed");
    };
  }
  push(v) {
    v = Math.max(-1, Math.min(1, v));
    this.buf[this.n++] = v < 0 ? v * 32768 : v * 32767;
    if (this.n === this.buf.length) {
      const out = this.buf.buffer; this.buf = new Int16Array(${CHUNK}); this.n = 0;
      this.port.postMessage(out, [out]);
    }
  }
  process(inputs) {
    const input = inputs[0];
    if (!input || !input.length) return true;
    const x = input[0];
    if (this.ratio === 1) { for (let i = 0; i < x.length; i++) this.push(x[i]); return true; }
    let t = this.t;  // linear interpolation; t is relative to this block, -1 = the last sample
    while (true) {
      const i = Math.floor(t), f = t - i;
      if (i + 1 >= x.length) break;
      const a = i < 0 ? this.last : x[i];
      this.push(a + (x[i + 1] - a) * f);
      t += this.ratio;
    }
    this.t = t - x.length; this.last = x[x.length - 1];
    return true;
  }
}
registerProcessor("pcm16", Pcm16);`;

function micBar() {
  const bar = document.createElement("section");
  bar.id = "mic";
  bar.innerHTML = `
    <button id="record" type="button">● record</button>
    <button id="stop" type="button" disabled>■ stop</button>
    <span id="heard">0.0 s</span>
    <span id="mic-message" role="status"></span>
    <span id="activity" data-available="false"
      title="speech activity: the server's voice activity detection (xattn live --serve --vad)">
      ${MIC.vad ? "speech activity: waiting" : "speech activity: off (--vad)"}</span>`;
  document.getElementById("controls").before(bar);
  $("record").onclick = start;
  $("stop").onclick = stop;
}

function say(text, kind) {
  L.message = text;
  const el = $("mic-message");
  el.textContent = text; el.className = kind || "";
}

function phase(p) {
  L.phase = p; document.body.dataset.phase = p;
  $("record").disabled = p !== "idle";
  $("stop").disabled = p !== "recording";
  renderStatus();
}

// The inspector's status line, told about the microphone's phases.
const inspectorStatus = renderStatus;
renderStatus = function () {  // eslint-disable-line no-func-assign
  if (L.phase === "idle" || L.phase === "starting") {
    $("status").textContent = L.phase === "idle" ? "press record" : "starting…";
    $("status").className = "live"; document.body.dataset.done = "false";
    return;
  }
  inspectorStatus();
};

// An AudioContext at `rate` (null: the browser's own) with the worklet loaded.
async function audioContext(rate) {
  try {
    L.ctx = rate ? new AudioContext({ sampleRate: rate }) : new AudioContext();
  } catch (e) {
    L.ctx = new AudioContext();  // a browser that will not run at 16 kHz: the worklet resamples
  }
  const blob = URL.createObjectURL(new Blob([WORKLET], { type: "application/javascript" }));
  await L.ctx.audioWorklet.addModule(blob);
  URL.revokeObjectURL(blob);
}

async function start() {
  phase("starting");
  say("connecting…");
  // the worklet and the WebSocket first, so that no audio waits for them once the mic is on
  await audioContext(RATE);
  L.ws = new WebSocket(`ws://${location.host}${MIC.ws}`);
  L.ws.binaryType = "arraybuffer";
  L.ws.onmessage = (m) => received(JSON.parse(m.data));
  L.ws.onerror = () => {};  // onclose follows with the reason
  const opened = await new Promise((ok) => {
    L.ws.onopen = () => ok(true);
    L.ws.onclose = () => ok(false);
    setTimeout(() => ok(false), 10000);
  });
  if (!opened) { say("cannot reach the bridge (is `xattn live --serve` running?)", "error"); release(); phase("failed"); return; }
  L.ws.onclose = (e) => closed(e);
  say("asking for the microphone…");
  try {
    L.media = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
  } catch (e) {
    say(`no microphone: ${e.message || e.name}`, "error"); L.ws.close(1000, "no microphone"); release(); phase("failed"); return;
  }
  L.ws.send(JSON.stringify({ type: "start" }));
  let source;
  try {
    source = L.ctx.createMediaStreamSource(L.media);
  } catch (e) {  // e.g. Firefox: the microphone's rate only; the worklet resamples to 16 kHz
    L.ctx.close().catch(() => {});
    await audioContext(null);
    source = L.ctx.createMediaStreamSource(L.media);
  }
  L.node = new AudioWorkletNode(L.ctx, "pcm16", { channelCount: 1, channelCountMode: "explicit" });
  L.node.port.onmessage = (m) => chunk(m.data);
  source.connect(L.node);
  phase("recording");
  say(`recording (${L.ctx.sampleRate} Hz → 16 kHz)`);
}

function chunk(data) {
  if (L.flushed) return;  // the worklet may run on after stop: nothing more is sent
  const open = L.ws && L.ws.readyState === WebSocket.OPEN;
  if (data === "flushed") {
    L.flushed = true; L.node.disconnect();
    if (open) L.ws.send(JSON.stringify({ type: "stop" }));
    return;
  }
  const now = performance.now(), pcm = new Int16Array(data);
  if (L.firstChunkAt === null) L.firstChunkAt = now - (pcm.length / RATE) * 1000;
  L.pcm.push(pcm); L.samples += pcm.length;
  $("heard").textContent = `${(L.samples / RATE).toFixed(1)} s`;
  if (open) L.ws.send(data);
}

function stop() {
  if (L.phase !== "recording") return;
  phase("stopping");
  say("stopped: the last words are being decoded…");
  L.node.port.postMessage("flush");  // the partial chunk, then {"type": "stop"}
  release(true);
}

function release(keepNode) {
  if (L.media) L.media.getTracks().forEach((t) => t.stop());
  if (L.ctx && !keepNode) L.ctx.close().catch(() => {});
  L.media = null;
}

// One message of the bridge: the events of one live result, drawn once.
function received(events) {
  let ended = null;
  for (const ev of events) {
    if (ev.type === "started") continue;
    if (ev.type === "speech_activity") { L.activity.push(ev); showActivity(ev); continue; }
    if (ev.type === "segment") {
      L.finals.push({ at: performance.now(), wall: Date.now(), bridgeMs: ev.bridge_ms,
        backlog: L.samples / RATE - ev.bridge_sent_s,  // s of audio sent, not yet forwarded
        words: ev.words, text: ev.text, tokens: ev.tokens.length });
    }
    handle(ev, true);
    if (ev.type === "done" || ev.type === "error") ended = ev;
  }
  S.windows.forEach((w) => { if (w.tokens.length) attachWords(w); });
  refresh();
  if (ended && ended.type === "done") finish();
  if (ended && ended.type === "error") failed(ended);
}

function showActivity(ev) {  // VAD events, once the server sends them
  const el = $("activity");
  el.dataset.available = "true";
  el.textContent = ev.speaking ? "speech" : "silence";
  el.className = ev.speaking ? "speaking" : "";
}

function failed(ev) {
  const full = ev.code === "RESOURCE_EXHAUSTED";
  say(full ? `the server is full (${ev.message}): try again when another stream ends`
    : `the stream failed: ${ev.code}: ${ev.message}` + (S.segments.length ? " (the finals so far are kept)" : ""),
  "error");
  L.ctx && L.ctx.close().catch(() => {});
  release();
  playback();
  phase("failed");
}

function closed(e) {
  L.closed = { code: e.code, reason: e.reason };
  if (L.phase === "done" || L.phase === "failed") return;
  handle({ type: "error", code: `closed ${e.code}`, message: e.reason || "the bridge went away" });
  failed({ code: `closed ${e.code}`, message: e.reason || "the bridge went away" });
}

function finish() {
  L.ctx && L.ctx.close().catch(() => {});
  playback();
  phase("done");
  say(`done: ${(L.samples / RATE).toFixed(1)} s recorded; click a word to hear it`);
}

// The recording as a 16 kHz mono WAV for the inspector's player.
function playback() {
  if (!L.samples) return;
  const data = new DataView(new ArrayBuffer(44 + 2 * L.samples)), text = (at, s) =>
    [...s].forEach((c, i) => data.setUint8(at + i, c.charCodeAt(0)));
  text(0, "RIFF"); data.setUint32(4, 36 + 2 * L.samples, true); text(8, "WAVEfmt ");
  data.setUint32(16, 16, true); data.setUint16(20, 1, true); data.setUint16(22, 1, true);
  data.setUint32(24, RATE, true); data.setUint32(28, 2 * RATE, true);
  data.setUint16(32, 2, true); data.setUint16(34, 16, true); text(36, "data");
  data.setUint32(40, 2 * L.samples, true);
  let at = 44;
  for (const c of L.pcm) for (let i = 0; i < c.length; i++, at += 2) data.setInt16(at, c[i], true);
  audio.src = URL.createObjectURL(new Blob([data.buffer], { type: "audio/wav" }));
  $("audio-name").textContent = `the recording (${(L.samples / RATE).toFixed(1)} s)`;
}

window.xattnLive = {
  get phase() { return L.phase; },
  get message() { return L.message; },
  get sentSeconds() { return L.samples / RATE; },
  get firstChunkAt() { return L.firstChunkAt; },
  get finals() { return L.finals.slice(); },
  get closed() { return L.closed; },
  get activity() { return L.activity.slice(); },
  get windows() { return S.windows.map((w) => ({ window: w.window, offset: w.offset, frames: w.numFrames })); },
  recordedPcm() {  // what was sent, as base64 16 kHz mono int16 (benchmarks, tests)
    let bin = "";
    for (const c of L.pcm) {
      const bytes = new Uint8Array(c.buffer, c.byteOffset, c.byteLength);
      for (let i = 0; i < bytes.length; i += 8192) bin += String.fromCharCode(...bytes.subarray(i, i + 8192));
    }
    return btoa(bin);
  },
  start, stop,
};
micBar();
phase("idle");
