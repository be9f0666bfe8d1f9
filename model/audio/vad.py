"""Voice activity detection: Silero VAD (audio -> speech spans) and the map back to the clock.

The network is Silero VAD v6 (16 kHz), its weights read from the TorchScript file inside the
`silero-vad` wheel (nothing downloaded; the package's Python is not imported: its import sets
torch's thread count to 1 for the whole process). silero-vad 6.0 and 6.1 ship the weights of
faster-whisper's `silero_vad_v6.onnx` (6.2 retrained them), hence the pin `<6.2`.
Each 512-sample chunk (32 ms), with the 64 samples before it as context, goes through an STFT
and four convolutions: independent per chunk, so a whole file is one batched call; only the
LSTM runs chunk after chunk.

`speech_spans` turns the probabilities into spans exactly as faster-whisper's
`get_speech_timestamps` does (the same options and defaults), `SpeechMap` maps a time on the
joined speech back to the original clock as its `SpeechTimestampsMap` does.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import importlib.util
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

SAMPLE_RATE = 16000
CHUNK = 512  # samples a probability covers: 32 ms
CONTEXT = 64  # samples of the previous chunk the network sees before each chunk
_WEIGHTS = "silero_vad.jit"


@dataclass(frozen=True)
class VadOptions:
    """faster-whisper's VadOptions, same names and defaults."""

    threshold: float = 0.5  # probability at or above which a chunk is speech
    neg_threshold: float | None = None  # below it: silence; None: max(threshold - 0.15, 0.01)
    min_speech_duration_ms: int = 0  # shorter spans are dropped
    max_speech_duration_s: float = math.inf  # longer spans are split (at a silence if any)
    min_silence_duration_ms: int = 2000  # silence that ends a span
    speech_pad_ms: int = 400  # padding on each side of a span

    def check(self) -> None:
        """ValueError naming the field and its allowed range."""
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"vad_options.threshold {self.threshold} is outside [0, 1]")
        if self.neg_threshold is not None and not 0.0 <= self.neg_threshold <= 1.0:
            raise ValueError(f"vad_options.neg_threshold {self.neg_threshold} is outside [0, 1]")
        for name in ("min_speech_duration_ms", "min_silence_duration_ms", "speech_pad_ms"):
            value = getattr(self, name)
            if not 0 <= value <= 3_600_000:
                raise ValueError(f"vad_options.{name} {value} is outside [0, 3600000]")
        if not self.max_speech_duration_s > 0:
            raise ValueError(
                f"vad_options.max_speech_duration_s {self.max_speech_duration_s} must be > 0"
            )


@dataclass(frozen=True)
class SpeechSpan:
    """Speech from sample `start` to `end` (exclusive) of the original audio."""

    start: int
    end: int

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


class SileroVad(nn.Module):
    """Silero VAD v6 for 16 kHz audio: chunks [N, 64 + 512] -> speech probabilities [N]."""

    def __init__(self) -> None:
        super().__init__()
        self.stft = nn.Conv1d(1, 258, 256, stride=128, bias=False)  # real and imaginary bases
        self.convs = nn.ModuleList(
            nn.Conv1d(i, o, 3, stride=s, padding=1)
            for i, o, s in ((129, 128, 1), (128, 64, 2), (64, 64, 2), (64, 128, 1))
        )
        self.lstm = nn.LSTM(128, 128, batch_first=True)
        self.out = nn.Conv1d(128, 1, 1)

    @classmethod
    def load(cls) -> SileroVad:
        with warnings.catch_warnings():  # torch.jit.load is deprecated (still works)
            warnings.simplefilter("ignore", FutureWarning)
            sd = torch.jit.load(str(weights_path()), map_location="cpu")._model.state_dict()
        state = {"stft.weight": sd["stft.forward_basis_buffer"]}
        for i in range(4):
            state[f"convs.{i}.weight"] = sd[f"encoder.{i}.reparam_conv.weight"]
            state[f"convs.{i}.bias"] = sd[f"encoder.{i}.reparam_conv.bias"]
        for part in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            state[f"lstm.{part}_l0"] = sd[f"decoder.rnn.{part}"]
        state["out.weight"] = sd["decoder.decoder.2.weight"]
        state["out.bias"] = sd["decoder.decoder.2.bias"]
        vad = cls()
        vad.load_state_dict(state)
        return vad.eval()

    def features(self, chunks: torch.Tensor) -> torch.Tensor:
        """Per-chunk encoder output: chunks [N, 576] -> [N, 128]. The convolutions run as
        matrix products over the chunks, position by position (a chunk has 4 STFT frames):
        the same sums as conv1d up to rounding, 2x faster for a 10-minute file (tiny
        lengths and a huge batch are conv1d's slowest shape)."""
        n, hop = chunks.shape[0], self.stft.stride[0]  # hop 128, frames of 256
        width = self.stft.kernel_size[0]
        basis = self.stft.weight[:, 0].T  # [256, 258]
        spec = chunks.new_empty(4, n, basis.shape[1])  # [4, N, 258]: frames first
        for f in range(3):  # inside the chunk: views with a row stride, no copy
            torch.mm(chunks[:, f * hop : f * hop + width], basis, out=spec[f])
        tail = nn.functional.pad(chunks[:, 3 * hop :], (0, CONTEXT), mode="reflect")  # [N, 256]
        torch.mm(tail, basis, out=spec[3])
        power = spec.square()  # [4, N, 258]
        x = (power[..., :129] + power[..., 129:]).sqrt_()  # [4, N, 129] magnitude
        for conv in self.convs:
            x = conv_positions(x, conv).relu_()  # [4, N, 128] -> [2, N, 64] -> [1, N, 64] ...
        return x[0]  # [N, 128]

    def forward(
        self, chunks: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Probabilities [N] of N consecutive chunks [N, 576], and the LSTM state after them
        (pass it back in to continue a stream)."""
        feats = self.features(chunks)  # [N, 128]
        with one_thread():  # a step is tiny: OpenMP's barriers cost more than the work
            h, state = self.lstm(feats[None], state)  # [1, N, 128]
        logits = self.out(torch.relu(h[0])[:, :, None])  # [N, 1, 1]
        return torch.sigmoid(logits)[:, 0, 0], state  # [N]


def conv_positions(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """conv1d (kernel 3, padding 1) over x [L, N, C] with the positions first: each output
    position a sum of matrix products of its taps' positions [N, C] -> [L', N, O]."""
    w, stride, length = conv.weight, conv.stride[0], x.shape[0]  # w [O, C, 3]
    out = x.new_empty((length - 1) // stride + 1, x.shape[1], w.shape[0])  # [L', N, O]
    for j in range(out.shape[0]):
        taps = [(t, j * stride + t - 1) for t in range(3) if 0 <= j * stride + t - 1 < length]
        (t, i), rest = taps[0], taps[1:]
        torch.addmm(conv.bias, x[i], w[:, :, t].T, out=out[j])
        for t, i in rest:
            out[j].addmm_(x[i], w[:, :, t].T)
    return out


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread inside (the calling thread's OpenMP setting), restored after.
    Measured under load on 2 cores: the LSTM over 60 s (1,876 steps) took 10-37 s on 2
    threads, 0.4 s on one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class VadUnavailable(RuntimeError):
    """Voice activity detection asked of an install without the silero-vad package."""


def weights_path() -> Path:
    """The TorchScript file inside the installed silero-vad wheel (the package not imported);
    VadUnavailable without it (cheap: the request validation asks before any work)."""
    package = silero_package()
    if package is None:
        raise VadUnavailable(
            "voice activity detection needs the silero-vad package, which this install lacks: "
            "install xattn[vad] where the model runs, or leave VAD off"
        )
    return package / "data" / _WEIGHTS


def silero_package() -> Path | None:
    """The installed silero_vad package's folder, or None."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def load_vad() -> SileroVad:
    """The process's one Silero network (its weights are read once)."""
    return SileroVad.load()


def with_context(audio: np.ndarray) -> torch.Tensor:
    """Audio padded with zeros to whole chunks, each chunk preceded by the 64 samples before
    it (zeros for the first): [N, 576]."""
    n = len(audio) // CHUNK + 1  # as faster-whisper: always at least one padding sample
    padded = np.zeros(n * CHUNK, dtype=np.float32)
    padded[: len(audio)] = audio
    chunks = torch.from_numpy(padded).view(n, CHUNK)  # [N, 512]
    context = torch.zeros(n, CONTEXT)  # [N, 64]
    context[1:] = chunks[:-1, -CONTEXT:]
    return torch.cat([context, chunks], dim=1)  # [N, 576]


def speech_probs(audio: np.ndarray) -> np.ndarray:
    """The speech probability of each 32 ms chunk of 16 kHz mono `audio`: [N] float32."""
    with torch.inference_mode():
        probs, _ = load_vad()(with_context(np.asarray(audio, dtype=np.float32)))
    return probs.numpy()


def speech_spans(
    probs: Sequence[float] | np.ndarray, n_samples: int, options: VadOptions | None = None
) -> list[SpeechSpan]:
    """faster-whisper's `get_speech_timestamps` on the chunk probabilities (pure)."""
    o = options or VadOptions()
    rate, window = SAMPLE_RATE, CHUNK
    min_speech = rate * o.min_speech_duration_ms / 1000
    pad = rate * o.speech_pad_ms / 1000
    max_speech = rate * o.max_speech_duration_s - window - 2 * pad
    min_silence = rate * o.min_silence_duration_ms / 1000
    min_silence_at_max = rate * 98 / 1000
    neg = o.neg_threshold if o.neg_threshold is not None else max(o.threshold - 0.15, 0.01)

    triggered, spans, start = False, [], None
    temp_end = prev_end = next_start = 0
    for i, p in enumerate(probs):
        here = window * i
        if p >= o.threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = here
        if p >= o.threshold and not triggered:
            triggered, start = True, here
            continue
        if triggered and here - start > max_speech:
            if prev_end:
                spans.append([start, prev_end])
                if next_start < prev_end:  # silence reached and still no speech
                    triggered, start = False, None
                else:
                    start = next_start
                prev_end = next_start = temp_end = 0
            else:
                spans.append([start, here])
                prev_end = next_start = temp_end = 0
                triggered, start = False, None
                continue
        if p < neg and triggered:
            if not temp_end:
                temp_end = here
            if here - temp_end > min_silence_at_max:
                prev_end = temp_end
            if here - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                spans.append([start, temp_end])
            prev_end = next_start = temp_end = 0
            triggered, start = False, None
            continue
    if start is not None and n_samples - start > min_speech:
        spans.append([start, n_samples])

    for i, span in enumerate(spans):
        if i == 0:
            span[0] = int(max(0, span[0] - pad))
        if i != len(spans) - 1:
            gap = spans[i + 1][0] - span[1]
            if gap < 2 * pad:
                span[1] += int(gap // 2)
                spans[i + 1][0] = int(max(0, spans[i + 1][0] - gap // 2))
            else:
                span[1] = int(min(n_samples, span[1] + pad))
                spans[i + 1][0] = int(max(0, spans[i + 1][0] - pad))
        else:
            span[1] = int(min(n_samples, span[1] + pad))
    return [SpeechSpan(int(a), int(b)) for a, b in spans]


UNSURE = 0.15  # a chunk's probability from here up to the threshold: Silero is unsure of it
UNSURE_THRESHOLD = 0.05  # the threshold for a file Silero is unsure of throughout


def calibrated(probs: np.ndarray, options: VadOptions) -> VadOptions:
    """`options`, or with threshold 0.05 (silence below 0.01) when Silero is unsure of the whole
    file: more of its chunks score from 0.15 up to the threshold than at or above it (pure).

    Silero scores narrow-band speech under line noise low throughout: on the long-form set's
    telephone file 5.8 % of chunks reach 0.5, 30 % lie in [0.15, 0.5), a ratio of 5.2, while
    on every real clip of ../shared/eval, jfk and the set's other files the ratio is at most
    0.25. Its silence and hiss mostly score below 0.01 there, its speech mostly above 0.05, so
    that threshold keeps the speech; what it lets through besides, the decoder's no-speech rule
    still drops (docs/how-it-works.md, "Batched long-form")."""
    sure = int(np.count_nonzero(probs >= options.threshold))
    unsure = int(np.count_nonzero((probs >= UNSURE) & (probs < options.threshold)))
    if unsure <= sure or options.threshold <= UNSURE_THRESHOLD:
        return options
    return replace(options, threshold=UNSURE_THRESHOLD, neg_threshold=None)


def detect_speech(audio: np.ndarray, options: VadOptions | None = None) -> list[SpeechSpan]:
    """Speech spans of 16 kHz mono `audio` (Silero probabilities, then `speech_spans`)."""
    return speech_spans(speech_probs(audio), len(audio), options)


def join_speech(audio: np.ndarray, spans: Sequence[SpeechSpan]) -> np.ndarray:
    """The spans' audio, back to back."""
    if not spans:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([audio[s.start : s.end] for s in spans]).astype(np.float32, copy=False)


def group_spans(
    spans: Sequence[SpeechSpan], max_seconds: float = 30.0
) -> list[tuple[SpeechSpan, ...]]:
    """Consecutive spans joined into groups of at most `max_seconds` of speech (faster-whisper's
    `collect_chunks` with max_duration; a longer span stays alone in its group)."""
    groups: list[list[SpeechSpan]] = []
    length, limit = 0, max_seconds * SAMPLE_RATE
    for span in spans:
        n = span.end - span.start
        if not groups or length + n > limit:
            groups.append([span])
            length = n
        else:
            groups[-1].append(span)
            length += n
    return [tuple(g) for g in groups]


class SpeechMap:
    """Times on the joined speech -> times on the original clock (faster-whisper's
    SpeechTimestampsMap: a time belongs to the span whose joined end follows it)."""

    def __init__(self, spans: Sequence[SpeechSpan], precision: int = 2) -> None:
        self.precision = precision
        self.ends: list[int] = []  # each span's end, in samples of the joined speech
        self.silence: list[float] = []  # seconds removed before each span
        previous, removed = 0, 0
        for span in spans:
            removed += span.start - previous
            previous = span.end
            self.ends.append(span.end - removed)
            self.silence.append(removed / SAMPLE_RATE)

    def index(self, time: float, is_end: bool = False) -> int:
        """The span a joined-speech time falls in."""
        if not self.ends:
            return 0
        sample = int(time * SAMPLE_RATE)
        if is_end and sample in self.ends:
            return self.ends.index(sample)
        return min(bisect.bisect(self.ends, sample), len(self.ends) - 1)

    def original(self, time: float, index: int | None = None, is_end: bool = False) -> float:
        """`time` on the joined speech -> seconds on the original clock."""
        if not self.ends:
            return time
        i = self.index(time, is_end) if index is None else index
        return round(self.silence[i] + time, self.precision)

    def shift(self, time: float) -> float:
        """Seconds to add to a joined-speech time to put it on the original clock (unrounded)."""
        return self.silence[self.index(time)] if self.ends else 0.0
