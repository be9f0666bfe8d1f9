"""Proto ⇄ dataclasses: requests into audio loaders and DecodeOptions, model events into
xattn.v1 messages. Pure functions and small stateful shapers; no gRPC, no threads.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from xattn.model.audio.features import AudioError, AudioTooLongError, decode_audio, pcm_to_audio
from xattn.model.audio.vad import VadOptions, weights_path
from xattn.model.decode.decoding import DEFAULT_TEMPERATURES, DecodeOptions, OptionsError
from xattn.model.decode.results import (
    FRAMES_PER_SECOND,
    Segment,
    TokenEvent,
    Transcript,
    WindowDiscarded,
    WindowStart,
    WordTiming,
)
from xattn.model.decode.tokenizer import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS
from xattn.model.net.dims import ModelDims
from xattn.model.pipeline import Pipeline, compute_note
from xattn.service.engine.engine import Event, Limits, Timings
from xattn.service.engine.rows import RowSpec
from xattn.v1 import transcriber_pb2 as pb

Workers = Callable[[str], int] | None  # a model's resolved worker (or live stream) count

PCM_ENCODINGS = {pb.PCM_ENCODING_INT16: "int16", pb.PCM_ENCODING_FLOAT32: "float32"}
TASKS = {pb.TASK_UNSPECIFIED: "transcribe", pb.TASK_TRANSCRIBE: "transcribe"}
TASKS[pb.TASK_TRANSLATE] = "translate"
FRAMES_PER_WINDOW = 1500  # encoder frames in a 30 s window
T = TypeVar("T")


def audio_loader(
    audio: pb.Audio,
    max_seconds: float,
    decode: Callable[..., np.ndarray] = decode_audio,
) -> Callable[[], np.ndarray]:
    """Check what can be checked without decoding; return the (slow) decode as a thunk; an
    encoded file's through `decode` (decode_audio's signature; the server's decodes in worker
    processes, xattn.service.engine.decoders).

    Raises AudioError (AudioTooLongError) for audio that is missing, empty or too long.
    """
    source = audio.WhichOneof("source")
    if source == "encoded":
        data = audio.encoded
        if not data:
            raise AudioError("audio.encoded is empty (0 bytes)")
        return lambda: decode(data, max_seconds=max_seconds)
    if source == "pcm":
        pcm = audio.pcm
        if pcm.encoding not in PCM_ENCODINGS:
            raise AudioError("audio.pcm.encoding must be PCM_ENCODING_INT16 or _FLOAT32")
        encoding, channels = PCM_ENCODINGS[pcm.encoding], pcm.channels or 1
        if not pcm.data:
            raise AudioError("audio.pcm.data is empty (0 bytes)")
        if pcm.sample_rate <= 0:
            raise AudioError(f"audio.pcm.sample_rate must be positive, not {pcm.sample_rate}")
        width = 2 if encoding == "int16" else 4
        seconds = len(pcm.data) / (width * max(channels, 1) * pcm.sample_rate)
        if seconds > max_seconds:
            raise AudioTooLongError(
                f"audio is too long: {seconds:.1f} s of PCM, limit {max_seconds:g} s"
            )
        data, rate = pcm.data, pcm.sample_rate
        return lambda: pcm_to_audio(data, rate, encoding, channels)
    raise AudioError("no audio: set audio.encoded (a file's bytes) or audio.pcm")


# Transcribe's and StreamTranscribe's search when unset: faster-whisper's and the whisper
# command line's (beam 5, best-of 5); the live StreamingRecognize stays greedy
SERVICE_BEAM_SIZE = 5
SERVICE_BEST_OF = 5


def decode_options(options: pb.TranscriptionOptions, return_attention: bool) -> DecodeOptions:
    """TranscriptionOptions -> DecodeOptions (OptionsError for values no model takes)."""
    if options.task not in TASKS:
        raise OptionsError(f"unknown task {options.task}")
    temperatures = tuple(float(t) for t in options.temperatures) or DEFAULT_TEMPERATURES
    for t in temperatures:
        if not math.isfinite(t) or t < 0:
            raise OptionsError(f"temperature {t} must be finite and >= 0")
    if options.vad_filter:
        weights_path()  # VadUnavailable (UNIMPLEMENTED) on a server without silero-vad
    condition = True
    if options.HasField("condition_on_previous_text"):
        condition = options.condition_on_previous_text
    return DecodeOptions(
        language=options.language or None,
        task=TASKS[options.task],
        temperatures=temperatures,
        condition_on_previous_text=condition,
        word_timestamps=options.word_timestamps,
        return_attention=return_attention,
        initial_prompt=options.initial_prompt or None,
        prefix=options.prefix or None,
        hotwords=options.hotwords or None,
        suppress_tokens=(
            tuple(options.suppress_tokens.ids) if options.HasField("suppress_tokens") else (-1,)
        ),
        suppress_blank=optional(options, "suppress_blank", True),
        without_timestamps=options.without_timestamps,
        max_initial_timestamp=optional(options, "max_initial_timestamp", 1.0),
        compression_ratio_threshold=threshold(options, "compression_ratio_threshold", 2.4),
        logprob_threshold=threshold(options, "logprob_threshold", -1.0),
        no_speech_threshold=threshold(options, "no_speech_threshold", 0.6),
        hallucination_silence_threshold=optional(options, "hallucination_silence_threshold"),
        clip_timestamps=tuple(options.clip_timestamps),
        prepend_punctuations=optional(options, "prepend_punctuations", PREPEND_PUNCTUATIONS),
        append_punctuations=optional(options, "append_punctuations", APPEND_PUNCTUATIONS),
        beam_size=optional(options, "beam_size", SERVICE_BEAM_SIZE),
        best_of=optional(options, "best_of", SERVICE_BEST_OF),
        patience=optional(options, "patience"),
        length_penalty=optional(options, "length_penalty"),
        vad_filter=options.vad_filter,
        vad_options=vad_options(options.vad_options) if options.HasField("vad_options") else None,
        batch_size=optional(options, "batch_size"),
    )


def vad_options(msg: pb.VadOptions, base: VadOptions | None = None) -> VadOptions:
    """VadOptions message -> VadOptions: set fields over `base` (OptionsError out of range)."""
    names = [f.name for f in msg.DESCRIPTOR.fields if msg.HasField(f.name)]
    result = dataclasses.replace(base or VadOptions(), **{n: getattr(msg, n) for n in names})
    try:
        result.check()
    except ValueError as e:
        raise OptionsError(str(e)) from None
    return result


def optional(options: pb.TranscriptionOptions, name: str, default: T | None = None) -> T | None:
    """An optional field's value, or `default` when unset."""
    return getattr(options, name) if options.HasField(name) else default


def threshold(options: pb.TranscriptionOptions, name: str, default: float) -> float | None:
    """A Threshold field: `default` when unset, None when off."""
    if not options.HasField(name):
        return default
    field = getattr(options, name)
    return None if field.off else field.value


def token_kind(event: TokenEvent, eot: int) -> int:
    if event.timestamp is not None:
        return pb.TOKEN_KIND_TIMESTAMP
    return pb.TOKEN_KIND_END_OF_TEXT if event.id == eot else pb.TOKEN_KIND_TEXT


def token(event: TokenEvent, eot: int, rows: RowSpec) -> pb.Token:
    msg = pb.Token(
        index=event.index,
        id=event.id,
        text=event.text,
        logprob=event.logprob,
        window=event.window,
        temperature=event.temperature,
        kind=token_kind(event, eot),
        early=event.early,
    )
    if event.timestamp is not None:
        msg.timestamp = event.timestamp
    if rows.enabled and event.attention is not None:
        msg.alignment.CopyFrom(rows.tensor(rows.select(event.attention)))
    return msg


def window_start(event: WindowStart) -> pb.WindowStart:
    return pb.WindowStart(
        window=event.window,
        offset=event.offset,
        num_frames=event.num_frames,
        language=event.language,
        clock=[
            pb.FrameSpan(first_frame=p.first, num_frames=p.count, start=p.start)
            for p in event.clock
        ],
    )


def window_discarded(event: WindowDiscarded) -> pb.WindowDiscarded:
    return pb.WindowDiscarded(
        window=event.window, temperature=event.temperature, reason=event.reason
    )


def words(timings: Iterable[WordTiming]) -> list[pb.Word]:
    return [
        pb.Word(word=w.word, start=w.start, end=w.end, probability=w.probability) for w in timings
    ]


def segment(seg: Segment) -> pb.Segment:
    return pb.Segment(
        id=seg.id,
        window=seg.window,
        seek=seg.seek,
        start=seg.start,
        end=seg.end,
        text=seg.text,
        tokens=seg.tokens,
        temperature=seg.temperature,
        avg_logprob=seg.avg_logprob,
        compression_ratio=seg.compression_ratio,
        no_speech_prob=seg.no_speech_prob,
        words=words(seg.words),
    )


def transcript(result: Transcript) -> pb.Transcript:
    return pb.Transcript(
        text=result.text,
        language=result.language,
        segments=[segment(s) for s in result.segments],
        duration=result.duration,
        speech=[pb.TimeSpan(start=s.start, end=s.end) for s in result.speech or ()],
        vad_filtered=result.speech is not None,
    )


def timings(t: Timings) -> pb.Timings:
    return pb.Timings(
        queue_seconds=t.queue,
        audio_seconds=t.audio,
        encode_seconds=t.encode,
        decode_seconds=t.decode,
        total_seconds=t.total,
    )


@dataclass
class StreamShaper:
    """Model events -> StreamTranscribeResponse, one for one (runs on the worker thread)."""

    rows: RowSpec
    eot: int

    def __call__(self, event: Event) -> pb.StreamTranscribeResponse:
        if isinstance(event, TokenEvent):
            return pb.StreamTranscribeResponse(token=token(event, self.eot, self.rows))
        if isinstance(event, WindowStart):
            return pb.StreamTranscribeResponse(window_start=window_start(event))
        if isinstance(event, WindowDiscarded):
            return pb.StreamTranscribeResponse(window_discarded=window_discarded(event))
        if isinstance(event, Segment):
            return pb.StreamTranscribeResponse(segment=segment(event))
        if isinstance(event, Transcript):
            return pb.StreamTranscribeResponse(done=pb.Done(transcript=transcript(event)))
        raise TypeError(f"unexpected event {type(event).__name__}")


@dataclass
class _Window:
    start: WindowStart
    indices: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    rows: list[np.ndarray] = field(default_factory=list)


@dataclass
class UnaryShaper:
    """Collects the rows of each window's accepted attempt; answers at the Transcript. Keyed
    by window: batched windows interleave their tokens."""

    rows: RowSpec
    windows: dict[int, _Window] = field(default_factory=dict)  # in WindowStart order

    def __call__(self, event: Event) -> pb.TranscribeResponse | None:
        if isinstance(event, WindowStart):
            self.windows[event.window] = _Window(event)
        elif isinstance(event, TokenEvent) and self.rows.enabled:
            w = self.windows[event.window]
            w.indices.append(event.index)
            w.ids.append(event.id)
            if event.attention is not None:
                w.rows.append(self.rows.select(event.attention))
        elif isinstance(event, WindowDiscarded) and event.window in self.windows:
            self.windows[event.window] = _Window(self.windows[event.window].start)
        elif isinstance(event, Transcript):
            response = pb.TranscribeResponse(transcript=transcript(event))
            if self.rows.enabled:
                response.windows.extend(self._alignment(w) for w in self.windows.values())
            return response
        return None

    def _alignment(self, w: _Window) -> pb.WindowAlignment:
        empty = np.zeros((0, self.rows.n_rows, FRAMES_PER_WINDOW), np.float32)
        matrix = np.stack(w.rows) if w.rows else empty  # [n_tokens, n_rows, 1500]
        return pb.WindowAlignment(
            window=w.start.window,
            offset=w.start.offset,
            num_frames=w.start.num_frames,
            token_indices=w.indices,
            token_ids=w.ids,
            matrix=self.rows.tensor(matrix),
        )


def model_dims(d: ModelDims) -> pb.ModelDims:
    return pb.ModelDims(**{f.name: getattr(d, f.name) for f in dataclasses.fields(d)})


def server_limits(
    limits: Limits, workers: int | None = None, live_streams: int | None = None
) -> pb.ServerLimits:
    """The limits as the proto reports them; `workers`: the resolved count (limits.workers
    may be 0, auto); `live_streams`: the live capacity (limits.max_live_streams may be 0,
    measured)."""
    return pb.ServerLimits(
        max_audio_seconds=limits.max_audio_seconds,
        max_receive_message_bytes=limits.max_receive_message_bytes,
        max_send_message_bytes=limits.max_send_message_bytes,
        workers=limits.workers if workers is None else workers,
        max_queue=limits.max_queue,
        max_live_seconds=limits.max_live_seconds,
        live_idle_timeout_seconds=limits.live_idle_timeout,
        max_live_streams=limits.max_live_streams if live_streams is None else live_streams,
        live_lag_target_seconds=limits.live_lag_target,
        live_compute=limits.live_precision or "",
        live_beam_size=limits.live_beam_size,
    )


def one_model(
    pipe: Pipeline, limits: Limits, workers: Workers = None, live: Workers = None
) -> pb.ModelInfo:
    exact, note = compute_note(pipe.compute)
    return pb.ModelInfo(
        model_name=pipe.name,
        dims=model_dims(pipe.dims),
        alignment_heads=[pb.AttentionHead(layer=la, head=h) for la, h in pipe.alignment_heads],
        alignment_heads_source=pipe.alignment_heads_source,
        languages=pipe.languages,
        multilingual=pipe.is_multilingual,
        compute_type=pipe.compute,
        device=pipe.device,
        compute_exact=exact,
        compute_note=note,
        checkpoint_format=pipe.checkpoint_format,
        checkpoint_dtype=pipe.checkpoint_dtype,
        limits=server_limits(
            limits, workers(pipe.name) if workers else None, live(pipe.name) if live else None
        ),
    )


# the fields GetModelInfoResponse carries, for its default model, as ModelInfo does for each
_TOP_LEVEL = (
    *("model_name", "dims", "alignment_heads", "alignment_heads_source", "languages"),
    *("multilingual", "compute_type", "device", "compute_exact", "compute_note", "limits"),
)


def model_info(
    pipe: Pipeline,
    limits: Limits,
    pipelines: Sequence[Pipeline] = (),
    workers: Workers = None,
    live: Workers = None,
) -> pb.GetModelInfoResponse:
    """`pipe` in the top-level fields; every model of the server (`pipelines`, default: just
    `pipe`) in `models`; `workers`: a model's resolved worker count, by name; `live`: its
    live capacity."""
    top = one_model(pipe, limits, workers, live)
    return pb.GetModelInfoResponse(
        **{name: getattr(top, name) for name in _TOP_LEVEL},
        alignment_frames_per_second=FRAMES_PER_SECOND,
        models=[one_model(p, limits, workers, live) for p in (pipelines or (pipe,))],
    )
