"""What each window starts from: its prompt, prefix and hotwords, the suppressed ids, and the
spans of the file to decode (clip_timestamps). Pure functions over token ids.

The layouts are the references': openai-whisper's `[<|startofprev|>, previous text…,
sot sequence, (<|notimestamps|>), prefix…]`, sampling after the prefix (which is not part of
the window's tokens); faster-whisper's hotwords go between `<|startofprev|>` and the previous
text, in every window that has no prefix. The prefix is for the first decoded window only,
as faster-whisper has it (openai-whisper's transcribe() would force it on every window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

FRAMES_PER_SECOND = 100  # mel frames
MIN_SAMPLE = 32  # tokens a window keeps for sampling when hotwords and prompt are long


def suppressed_ids(
    asked: Sequence[int], checkpoint_list: Sequence[int], always: Sequence[int]
) -> tuple[int, ...]:
    """openai-whisper's suppress list: the ids asked (-1 stands for the checkpoint's list) and
    the specials that are never sampled (tasks, start tokens, no-speech)."""
    ids = {t for t in asked if t >= 0} | set(always)
    if -1 in asked:
        ids |= set(checkpoint_list)
    return tuple(sorted(ids))


def seek_clips(clip_timestamps: Sequence[float], content_frames: int) -> list[tuple[int, int]]:
    """(start, end) mel frames of each clip, as openai-whisper pairs them (an odd count ends at
    the end of the file); frames past the audio are clamped to its end (such clips are empty)."""
    points = [min(round(t * FRAMES_PER_SECOND), content_frames) for t in clip_timestamps]
    if not points:
        points.append(0)
    if len(points) % 2:
        points.append(content_frames)
    return list(zip(points[::2], points[1::2], strict=True))


def window_tokens(
    *,
    sot_sequence: tuple[int, ...],
    previous: Sequence[int],
    sot_prev: int,
    no_timestamps: int,
    n_text_ctx: int,
    encode: Callable[[str], list[int]],
    prefix: str | None = None,
    hotwords: str | None = None,
    without_timestamps: bool = False,
) -> tuple[int, ...]:
    """The window's initial tokens; sampling begins after them (LogitRules.sample_begin)."""
    half = n_text_ctx // 2 - 1
    prompt = list(previous[-half:]) if previous else []
    if hotwords and not prefix:
        hot = encode(" " + hotwords.strip())[:half]
        # the previous text gives way only where the two would leave < MIN_SAMPLE tokens
        room = n_text_ctx - len(sot_sequence) - 2 - len(hot) - MIN_SAMPLE
        prompt = hot + (prompt[-room:] if room > 0 else [])
    initial = [sot_prev, *prompt] if prompt else []
    initial += [*sot_sequence, *([no_timestamps] if without_timestamps else [])]
    if prefix:
        initial += encode(" " + prefix.strip())[-half:]
    return tuple(initial)
