"""Long audio side by side: ours sequential, with vad_filter, batched (N = 4, 8, 16) against
faster-whisper sequential, vad_filter=True and BatchedInferencePipeline (batch 8, fp32 and
int8): seconds, real-time factor, WER against the text the file was built from, peak RSS.
faster-whisper's batched pipeline decodes text only (its `without_timestamps=True` default);
`ours-b8-text` is ours batched the same way, beside `ours-b8` with timestamps.

    .venv/bin/python -m benchmarks.longform_vad                  # a 10-minute file
    .venv/bin/python -m benchmarks.longform_vad --minutes 3 --systems ours-seq,ours-b8,fw-b8

The file: the English clips of ../shared/eval and jfk.flac (read there, never copied), in a
fixed shuffled order, repeated until `--minutes`, with 1-8 s of silence or faint noise between
them (seeded); its reference text is their transcripts joined. Each system runs in a process of
its own (model loaded and warmed up on 5 s first; the RSS is that process's peak), greedy at
temperature 0 only, English, fp32 unless named int8. WER: openai-whisper's English normaliser
and jiwer (benchmarks.wer).

With ours-b8, its process then measures the floor of that run on this CPU (`floor`): how fast
batched 8 could be with the work it did (its windows, its tokens) if the encoder ran at its
bound (benchmarks.decode.encoder_bound: matmuls at the fp32 ceiling measured here, softmax,
GELU, norms and adds at this CPU's speed) and every decoder forward only read its bytes at the
memory bandwidth measured here (each step the weights once for all its rows, each token its
window's cross-attention K/V), plus the voice detection and log-mel as they run. "ours
sequential / batched 8 at its floor" is then the most batching could gain over our sequential
mode on this host.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import results
from benchmarks.wer import errors, faster_whisper_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
JFK_TEXT = (
    "And so my fellow Americans ask not what your country can do for you, ask what you can "
    "do for your country."
)
SYSTEMS = (
    "ours-seq",
    "ours-vad",
    "ours-b4",
    "ours-b8",
    "ours-b16",
    "ours-b8-text",
    "fw-seq",
    "fw-vad",
    "fw-b8",
    "fw-b8-int8",
)
RATE = 16000


def build(minutes: float, seed: int = 0) -> tuple[np.ndarray, str]:
    """The long file and its reference text."""
    from xattn.model.audio.features import decode_audio

    rows = [json.loads(x) for x in (SHARED / "eval/manifest.jsonl").read_text().splitlines()]
    clips = [(SHARED / "eval" / r["file"], r["text"]) for r in rows if r["language"] == "en"]
    clips.append((SHARED / "audio/jfk.flac", JFK_TEXT))
    decoded = [(decode_audio(p), text) for p, text in clips]
    rng = np.random.default_rng(seed)
    parts, texts, total = [], [], 0
    while total < minutes * 60 * RATE:
        for i in rng.permutation(len(decoded)):
            audio, text = decoded[i]
            gap = int(rng.uniform(1.0, 8.0) * RATE)
            level = 0.0 if rng.random() < 0.5 else 0.003
            parts += [(rng.standard_normal(gap) * level).astype(np.float32), audio]
            texts.append(text)
            total += gap + len(audio)
            if total >= minutes * 60 * RATE:
                break
    return np.concatenate(parts), " ".join(texts)


def transcriber(system: str, threads: int):
    """(audio) -> text for `system`, loaded."""
    if system.startswith("ours"):
        import torch

        from xattn.model.decode.decoding import DecodeOptions
        from xattn.model.pipeline import load_pipeline

        torch.set_num_threads(threads)
        pipe = load_pipeline("tiny.en")
        batch = int(system[6:].split("-")[0]) if system.startswith("ours-b") else None
        options = DecodeOptions(
            language="en",
            temperatures=(0.0,),
            vad_filter=system != "ours-seq",
            batch_size=batch,
            without_timestamps=system.endswith("-text"),
        )

        def run_ours(audio):
            events = list(pipe.transcribe(audio, options))
            run_ours.events = events
            return events[-1].text

        run_ours.pipe, run_ours.options = pipe, options
        return run_ours
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    compute = "int8" if system.endswith("int8") else "float32"
    model = WhisperModel(
        str(faster_whisper_dir("tiny.en")), compute_type=compute, cpu_threads=threads
    )
    if system.startswith("fw-b"):
        batched = BatchedInferencePipeline(model)
        size = int(system[4:].split("-")[0])

        def run(audio):
            segments, _ = batched.transcribe(
                audio, language="en", beam_size=1, temperature=0.0, batch_size=size
            )
            return "".join(s.text for s in segments)

        return run

    def run_seq(audio):
        segments, _ = model.transcribe(
            audio, language="en", beam_size=1, temperature=0.0, vad_filter=system == "fw-vad"
        )
        return "".join(s.text for s in segments)

    return run_seq


def one(system: str, minutes: float, threads: int) -> dict:
    """Run one system here; its figures."""
    audio, reference = build(minutes)
    run = transcriber(system, threads)
    run(audio[: 5 * RATE])  # warm-up
    t0 = time.perf_counter()
    text = run(audio)
    seconds = time.perf_counter() - t0
    wrong, n = errors(reference, text, "en")
    row = {
        "system": system,
        "seconds": round(seconds, 2),
        "RTF": round(seconds / (len(audio) / RATE), 4),
        "WER %": round(100 * wrong / n, 2),
        "peak RSS MB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    if system == "ours-b8":
        row["floor"] = floor(run.pipe, run.options, audio, run.events)
    return row


def floor(pipe, options, audio: np.ndarray, events: list) -> dict:
    """The least time the batched run that gave `events` could take on this CPU (see the
    module's docstring), in parts; measured in this process (at its thread count), after the
    run."""
    import torch

    from benchmarks.decode import decoder_token_bytes, encoder_bound
    from xattn.model.audio.features import N_SAMPLES, log_mel_spectrogram
    from xattn.model.audio.vad import VadOptions, detect_speech
    from xattn.model.decode.results import TokenEvent, WindowStart

    windows = sum(isinstance(e, WindowStart) for e in events)
    tokens: dict[int, int] = {}
    for e in events:
        if isinstance(e, TokenEvent):
            tokens[e.window] = tokens.get(e.window, 0) + 1
    rows = sum(tokens.values())
    # each token but a window's first (the prompt's forward) comes from a batched step
    steps = max(-(-(rows - windows) // options.batch_size), max(tokens.values()) - 1)
    ceiling = results.ceilings(3)
    bound = encoder_bound(pipe.dims, ceiling.fp32_gflops, 5)
    encoder = windows * bound["ms, matmuls at the ceiling"] / bound["at most, of the ceiling"]
    nbytes = decoder_token_bytes(pipe.dims)
    shared = nbytes["output projection"] + nbytes["layer weights"]
    decoder = (steps * shared + rows * nbytes["cross K/V"]) / (ceiling.memory_gbps * 1e9)
    vad_options = VadOptions(max_speech_duration_s=30.0)
    with torch.inference_mode():
        vad = results.best_seconds(lambda: detect_speech(audio, vad_options), 2)
        window = audio[: 25 * RATE]
        mel = windows * results.best_seconds(
            lambda: log_mel_spectrogram(window, pipe.dims.n_mels, N_SAMPLES), 5
        )
    parts = {"encoder at its bound": encoder / 1e3, "decoder bytes at bandwidth": decoder}
    parts |= {"voice detection (as run)": vad, "log-mel (as run)": mel}
    return {
        "windows": windows,
        "tokens": rows,
        "batched steps, at least": steps,
        "fp32 GFLOP/s": ceiling.fp32_gflops,
        "GB/s": ceiling.memory_gbps,
        "encoder bound, of the ceiling": bound["at most, of the ceiling"],
        **{f"s, {k}": round(v, 2) for k, v in parts.items()},
        "s, floor": round(sum(parts.values()), 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one system, print its JSON
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.minutes, args.threads)))
        return
    rows = []
    for system in args.systems.split(","):
        cmd = [sys.executable, "-m", "benchmarks.longform_vad", "--one", system]
        cmd += ["--minutes", str(args.minutes), "--threads", str(args.threads)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        if "floor" in r:
            bound = r.pop("floor")
        print(
            f"{r['system']:12s} {r['seconds']:8.1f} s  RTF {r['RTF']:.3f}  "
            f"WER {r['WER %']:5.1f} %  RSS {r['peak RSS MB']:5d} MB",
            flush=True,
        )
    by = {r["system"]: r for r in rows}
    ratios = {}
    if "ours-seq" in by and "ours-b8" in by:
        ratios["ours sequential / ours batched 8"] = round(
            by["ours-seq"]["seconds"] / by["ours-b8"]["seconds"], 2
        )
    if "ours-seq" in by and "ours-b8-text" in by:
        ratios["ours sequential / ours batched 8 text-only"] = round(
            by["ours-seq"]["seconds"] / by["ours-b8-text"]["seconds"], 2
        )
    for ours in ("ours-b8", "ours-b8-text"):
        if "fw-b8" in by and ours in by:
            name = "batched 8 text-only" if ours.endswith("text") else "batched 8"
            ratios[f"ours {name} / faster-whisper batched 8 (fp32)"] = round(
                by[ours]["seconds"] / by["fw-b8"]["seconds"], 2
            )
    figures = {"long-form, VAD and batches": rows}
    if "ours-b8" in by:
        figures["batched 8 at its floor on this CPU"] = bound
        print("batched 8 at its floor: " + ", ".join(f"{k} {v}" for k, v in bound.items()))
        if "ours-seq" in by:
            ratios["ours sequential / batched 8 at its floor"] = round(
                by["ours-seq"]["seconds"] / bound["s, floor"], 2
            )
    for k, v in ratios.items():
        print(f"{k}: {v}")
    figures["ratios"] = ratios
    if not args.no_json:
        settings = {"minutes": args.minutes, "threads": args.threads, "model": "tiny.en"}
        path = results.write(args.json, "longform_vad", settings, figures)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
