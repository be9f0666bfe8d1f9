"""vad_filter around a whole-file transcription, as faster-whisper does it: detect the speech,
transcribe the spans joined back to back, and map every event's times to the file's clock.

Windows are cut from the joined speech, so a window's frames may come from several spans:
its WindowStart carries `clock` (FrameSpans: which frames lie where on the original clock) and
an offset on the original clock. Segments and words move as faster-whisper's
`restore_speech_timestamps` moves them (a word by the span of its middle, a segment without
words by its start and its end); token timings as words; online times by their own span.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from xattn.model.audio.vad import SAMPLE_RATE, SpeechMap, SpeechSpan, detect_speech, join_speech
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.model.decode.results import (
    FrameSpan,
    Segment,
    TimeSpan,
    TokenEvent,
    Transcript,
    WindowStart,
)

FRAME_SECONDS = 0.02  # an encoder frame
MAX_BATCH = 64  # windows decoded together by batch_size


def check_vad_options(options: DecodeOptions) -> None:
    """OptionsError naming the vad option that cannot be honoured."""
    if options.vad_options is not None:
        try:
            options.vad_options.check()
        except ValueError as e:
            raise OptionsError(str(e)) from None
    if options.vad_filter and options.clip_timestamps:
        raise OptionsError("vad_filter and clip_timestamps exclude each other: set one")
    if options.batch_size is not None and not 1 <= options.batch_size <= MAX_BATCH:
        raise OptionsError(f"batch_size {options.batch_size} is outside 1..{MAX_BATCH}")


def frame_clock(smap: SpeechMap, offset: float, num_frames: int) -> tuple[FrameSpan, ...]:
    """Where the frames of a window at `offset` (joined clock) lie on the original clock."""
    if not smap.ends or num_frames <= 0:
        return (FrameSpan(0, max(num_frames, 0), offset),)
    joined = offset + FRAME_SECONDS * np.arange(num_frames)  # [F] seconds
    ends = np.asarray(smap.ends)  # [S] samples
    span = np.minimum(
        np.searchsorted(ends, (joined * SAMPLE_RATE).astype(np.int64), side="right"),
        len(ends) - 1,
    )  # [F]
    cuts = np.flatnonzero(np.diff(span)) + 1
    starts = np.concatenate([[0], cuts])
    counts = np.diff(np.concatenate([starts, [num_frames]]))
    return tuple(
        FrameSpan(int(f), int(n), round(float(joined[f]) + smap.silence[span[f]], 3))
        for f, n in zip(starts, counts, strict=True)
    )


def map_segment(seg: Segment, smap: SpeechMap) -> Segment:
    """A segment of the joined speech on the original clock (restore_speech_timestamps)."""
    if seg.words:
        words = []
        for w in seg.words:
            i = smap.index((w.start + w.end) / 2)
            words.append(
                dataclasses.replace(w, start=smap.original(w.start, i), end=smap.original(w.end, i))
            )
        timings = []
        for t in seg.token_timings:
            i = smap.index((t.start + t.end) / 2)
            timings.append(
                dataclasses.replace(t, start=smap.original(t.start, i), end=smap.original(t.end, i))
            )
        return dataclasses.replace(
            seg,
            start=words[0].start,
            end=words[-1].end,
            words=tuple(words),
            token_timings=tuple(timings),
        )
    return dataclasses.replace(
        seg, start=smap.original(seg.start), end=smap.original(seg.end, is_end=True)
    )


def speech_events(
    transcribe: Callable[[np.ndarray, DecodeOptions], Iterator],
    audio: np.ndarray,
    options: DecodeOptions,
    spans: list[SpeechSpan] | None = None,
) -> Iterator:
    """The events of `transcribe` (a Pipeline's, without vad_filter) over the speech of
    `audio` (16 kHz mono), on the original clock; the Transcript says which spans were speech.
    `spans`: the speech, when already detected."""
    if spans is None:
        spans = detect_speech(audio, options.vad_options)
    duration = len(audio) / SAMPLE_RATE
    speech = tuple(TimeSpan(s.start_s, s.end_s) for s in spans)
    if not spans:  # nothing to decode
        language = options.language or "en"
        yield Transcript(text="", language=language, segments=(), duration=duration, speech=())
        return
    smap = SpeechMap(spans)
    inner = dataclasses.replace(options, vad_filter=False)
    segments: list[Segment] = []
    for event in transcribe(join_speech(audio, spans), inner):
        if isinstance(event, WindowStart):
            clock = frame_clock(smap, event.offset, event.num_frames)
            event = dataclasses.replace(event, offset=clock[0].start, clock=clock)
        elif isinstance(event, TokenEvent) and event.online_time is not None:
            event = dataclasses.replace(
                event, online_time=round(event.online_time + smap.shift(event.online_time), 2)
            )
        elif isinstance(event, Segment):
            event = map_segment(event, smap)
            segments.append(event)
        elif isinstance(event, Transcript):
            event = dataclasses.replace(
                event, segments=tuple(segments), duration=duration, speech=speech
            )
        yield event
