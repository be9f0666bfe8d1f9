"""What a live step encodes: the buffer's log-mel as one 30 s window, and how much of it.

With `encode_margin` (LiveOptions) a step encodes only the buffer's frames plus that margin,
rounded up to whole seconds so that shapes repeat (whisper.cpp's audio_ctx): the log-mel is
computed as for the whole window (normalised by the same maximum, so the kept frames' values
are today's), then cut; the encoder runs over those frames alone (AudioEncoder.forward), about
30 / (buffer + margin) times fewer frames each attending to as many fewer. The decoder's rows
cover the frames encoded; `full_rows` pads them with zeros to the window's 1,500.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from xattn.model.audio.features import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim

MEL_PER_SECOND = 100  # log-mel frames a second (10 ms hop); two make an encoder frame
GRID = 1.0  # seconds: a short window's length is rounded up to a whole number of these


def window_mel(buffer: np.ndarray, n_mels: int) -> tuple[torch.Tensor, int]:
    """The buffer's log-mel as one 30 s window [1, n_mels, 3000], and its frames of audio.
    On the model thread: its padding copies a window, a parallel op, and torch work on another
    thread brings an OpenMP team of its own onto the cores (xattn.model.decode.step_batcher)."""
    mel = log_mel_spectrogram(buffer, n_mels, N_SAMPLES)  # [n_mels, frames + 3000]
    content = min(N_FRAMES, mel.shape[-1] - N_FRAMES)
    return pad_or_trim(mel[:, :content], N_FRAMES)[None], content


def kept_frames(content: int, margin: float | None) -> int:
    """Log-mel frames a step encodes for `content` frames of audio: the whole window (3000)
    without a margin, else content + margin seconds rounded up to GRID (even, <= 3000)."""
    if margin is None:
        return N_FRAMES
    grid = round(GRID * MEL_PER_SECOND)
    wanted = content + round(margin * MEL_PER_SECOND)
    return max(grid, min(N_FRAMES, math.ceil(wanted / grid) * grid))


def full_rows(attention: np.ndarray, width: int = N_FRAMES // 2) -> np.ndarray:
    """Attention rows [..., frames] zero-padded to [..., width] (the window's 1,500 frames)."""
    missing = width - attention.shape[-1]
    if missing <= 0:
        return attention
    return np.pad(attention, [(0, 0)] * (attention.ndim - 1) + [(0, missing)])
