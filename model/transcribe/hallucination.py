"""openai-whisper's `hallucination_silence_threshold`: with word timestamps, skip long
silences before text that looks hallucinated (improbable, very short or very long words).

Pure functions over one window's segments (start, end, words) after word alignment; they say
where to seek next and how many of the window's segments to keep.
"""

from __future__ import annotations

from collections.abc import Sequence

from xattn.model.decode.results import WordTiming

FRAMES_PER_SECOND = 100  # mel frames
WINDOW_FRAMES = 3000  # mel frames in a 30 s window
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"  # words made of these do not count


def word_anomaly_score(word: WordTiming) -> float:
    duration = word.end - word.start
    score = 1.0 if word.probability < 0.15 else 0.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_anomaly(words: Sequence[WordTiming] | None) -> bool:
    """Whether a segment's first 8 words (punctuation aside) look hallucinated."""
    if not words:
        return False
    kept = [w for w in words if w.word not in PUNCTUATION][:8]  # substring test, as openai's
    score = sum(word_anomaly_score(w) for w in kept)
    return score >= 3 or score + 0.01 >= len(kept)


def last_end(
    bounds: Sequence[tuple[float, float]], words: Sequence[Sequence[WordTiming]]
) -> float | None:
    """The last word's end, else the last segment's end (None without segments)."""
    ends = (w.end for ws in reversed(words) for w in reversed(ws))
    return next(ends, bounds[-1][1] if bounds else None)


def skip_silence(
    bounds: Sequence[tuple[float, float]],
    words: Sequence[Sequence[WordTiming]],
    *,
    threshold: float,
    seek: int,
    window_seek: int,
    segment_size: int,
    single_ending: bool,
    last_speech: float,
    content_frames: int,
) -> tuple[int, int | None]:
    """The next seek (mel frames) and how many segments to keep (None: drop the window, its
    first speech is a hallucination after a silence longer than `threshold`)."""
    time_offset = window_seek / FRAMES_PER_SECOND
    window_end = (window_seek + WINDOW_FRAMES) / FRAMES_PER_SECOND
    segment_duration = segment_size / FRAMES_PER_SECOND
    content_duration = content_frames / FRAMES_PER_SECOND
    if not single_ending:
        end = last_end(bounds, words)
        if end is not None and end > time_offset:
            if window_end - end > threshold:
                seek = round(end * FRAMES_PER_SECOND)
            else:
                seek = window_seek + segment_size
    with_words = [i for i, ws in enumerate(words) if ws]
    if with_words and is_anomaly(words[with_words[0]]):
        gap = bounds[with_words[0]][0] - time_offset
        if gap > threshold:
            return window_seek + round(gap * FRAMES_PER_SECOND), None
    hal_last_end = last_speech
    for k, i in enumerate(with_words):
        start, end = bounds[i]
        if is_anomaly(words[i]):
            following = with_words[k + 1] if k + 1 < len(with_words) else None
            if following is not None:
                next_start = words[following][0].start
            else:
                next_start = time_offset + segment_duration
            silence_before = (
                start - hal_last_end > threshold or start < threshold or start - time_offset < 2.0
            )
            silence_after = (
                next_start - end > threshold
                or is_anomaly(words[following] if following is not None else None)
                or window_end - end < 2.0
            )
            if silence_before and silence_after:
                seek = round(max(time_offset + 1, start) * FRAMES_PER_SECOND)
                if content_duration - end < threshold:
                    seek = content_frames
                return seek, i
        hal_last_end = end
    return seek, len(bounds)
