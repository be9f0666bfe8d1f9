"""What a live step encodes: the buffer's log-mel as one 30 s window, and how much of it.

With `encode_margin` (LiveOptions) a step encodes only the buffer's frames plus that margin,
rounded up to whole seconds so that shapes repeat (whisper.cpp's audio_ctx): the log-mel is
computed as for the whole window (normalised by the same maximum, so the kept frames' values
are today's), then cut; the encoder runs over those frames alone (AudioEncoder.forward), about
30 / (buffer + margin) times fewer frames each attending to as many fewer.

A short window also encodes TAIL seconds of padding at the window's last positions. There the
decoder looks when a token reads no audio (punctuation, the end of text): without them the
look lands on an early frame of the audio, and a word's inner tokens with it (tiny.en read
"Hester" with 'ester' peaking at 0.24 s, 1.7 s before its sound), which the live policy takes
for a loop back over heard audio. The decoder's rows cover the frames encoded; `window_frame`
places a row's index in the window, and `full_rows` the rows, zero-padded to its 1,500.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from xattn.model.audio.features import (
    HOP_LENGTH,
    N_FRAMES,
    SAMPLE_RATE,
    log_mel_spectrogram,
    pad_or_trim,
)

MEL_PER_SECOND = 100  # log-mel frames a second (10 ms hop); two make an encoder frame
GRID = 1.0  # seconds: a short window's length is rounded up to a whole number of these
# seconds: a short window is never shorter (Whisper, trained on 30 s windows, reads a few
# seconds' window less surely: base looped on "Remember" and read "Turn left at" as Welsh)
SHORTEST = 10.0
TAIL = 1.0  # seconds of the window's end a short window encodes too
SHORT = 2.0  # seconds: the encode_margin of the server's short live window (--live-window)
# seconds: the server's short live window slides its buffer past this (LiveOptions.max_buffer),
# so a step encodes 10 to 14 s and the window's last second whatever the stream's length
SHORT_BUFFER = 12.0
WIDTH = N_FRAMES // 2  # a whole window's encoder frames
PAD = SAMPLE_RATE  # samples of silence after a buffer before its log-mel (window_mel)


def window_mel(buffer: np.ndarray, n_mels: int) -> tuple[torch.Tensor, int]:
    """The buffer's log-mel as one 30 s window [1, n_mels, 3000], and its frames of audio, bit
    for bit as the file path takes it (as openai-whisper's transcribe: the log-mel of the audio
    and 30 s of silence, normalised by its maximum, its first frames zero-padded to a window),
    from one second of silence instead of 30: the frames after the audio's last few are the
    floor either way, and the maximum is the audio's (a 12 s buffer: 1.5 ms, not 9, a step).
    On the model thread: its padding copies a window, a parallel op, and torch work on another
    thread brings an OpenMP team of its own onto the cores (xattn.model.decode.step_batcher)."""
    mel = log_mel_spectrogram(buffer, n_mels, PAD)  # [n_mels, frames + 100]
    content = min(N_FRAMES, mel.shape[-1] - PAD // HOP_LENGTH)
    return pad_or_trim(mel[:, :content], N_FRAMES)[None], content


def kept_frames(content: int, margin: float | None, floor: float = SHORTEST) -> int:
    """Log-mel frames a step encodes from the window's front for `content` frames of audio:
    the whole window (3000) without a margin, else content + margin seconds rounded up to
    GRID, at least `floor` seconds (even, <= 3000)."""
    if margin is None:
        return N_FRAMES
    grid = round(GRID * MEL_PER_SECOND)
    wanted = content + round(margin * MEL_PER_SECOND)
    shortest = round(floor * MEL_PER_SECOND)
    return max(shortest, min(N_FRAMES, math.ceil(wanted / grid) * grid))


def tail_frames(frames: int) -> int:
    """Encoder frames at the window's end that a step of `frames` log-mel frames from its
    front encodes too: TAIL seconds, none for a whole window (the sum stays <= 1,500)."""
    return min(round(TAIL * MEL_PER_SECOND) // 2, WIDTH - frames // 2)


def window_frame(index: int, encoded: int, tail: int) -> int:
    """The window's frame of column `index` of a row over `encoded` frames whose last `tail`
    sit at the window's end."""
    return index if index < encoded - tail else index + WIDTH - encoded


def full_rows(attention: np.ndarray, tail: int = 0) -> np.ndarray:
    """Attention rows [..., frames] (the last `tail` at the window's end) as the window's
    [..., 1500], zero where nothing was encoded."""
    missing = WIDTH - attention.shape[-1]
    if missing <= 0:
        return attention
    front = attention.shape[-1] - tail
    out = np.zeros((*attention.shape[:-1], WIDTH), dtype=attention.dtype)  # [..., 1500]
    out[..., :front] = attention[..., :front]
    out[..., WIDTH - tail :] = attention[..., front:]
    return out
