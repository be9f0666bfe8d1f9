"""Resampling a stream to 16 kHz as it arrives, equal (to float rounding) to torchaudio's
resample of the whole signal, in numpy: it runs on the calling thread (the HTTP server's event
loop, for the realtime API), where a torch convolution or a BLAS product would start a pool of
threads of its own beside the model thread's (more pools than cores: every op waits to wake
them)."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torchaudio.functional.functional import _get_sinc_resample_kernel

from xattn.model.audio.features import resample_ratio


@functools.cache
def sinc_kernel(p: int, q: int) -> tuple[np.ndarray, int]:
    """torchaudio's resampling kernel from rate p to rate q (coprime): [q, taps], and its
    half width in input samples (tiny torch ops: no OpenMP team for the calling thread)."""
    kernel, width = _get_sinc_resample_kernel(p, q, 1, dtype=torch.float32)  # [q, 1, taps]
    return kernel[:, 0].numpy(), width


def polyphase(x: np.ndarray, p: int, q: int) -> np.ndarray:
    """torchaudio's `resample(x, p, q)` (to float rounding) in numpy: each output phase a
    strided correlation with its row of the kernel (pure)."""
    kernel, width = sinc_kernel(p, q)  # [q, taps]
    padded = np.pad(x, (width, width + p))
    frames = (len(padded) - kernel.shape[1]) // p + 1
    y = np.empty((frames, q), np.float32)  # [frames, q]: q outputs for each p inputs
    for j in range(q):
        y[:, j] = np.correlate(padded, kernel[j], "valid")[::p][:frames]
    return y.reshape(-1)[: -(-q * len(x) // p)]


class StreamResampler:
    """Mono float32 at `rate` in any pieces -> 16 kHz float32, equal (to float rounding) to
    torchaudio's resample of the whole signal: each call resamples the new samples with a
    margin of those before (and after: kept until they arrive) that the kernel reaches."""

    def __init__(self, rate: int) -> None:
        ratio = resample_ratio(rate)  # a coprime rate's, rounded as the whole-file resampler's
        self.p, self.q = ratio.numerator, ratio.denominator  # p in -> q out
        self.margin = self.p * max(1, -(-64 // self.p))  # input samples; > the kernel's reach
        self._buf = np.zeros(self.margin, np.float32)  # input from position _start on
        self._start = -self.margin  # the signal starts with zeros, as torchaudio pads it
        self._done = 0  # input position (a multiple of p) up to which output was given

    def _out(self, upto: int, pad: int = 0) -> np.ndarray:
        """The output for input positions [_done, upto); upto - _start + pad is whole steps."""
        x = np.concatenate([self._buf[: upto + self.margin - self._start], np.zeros(pad)])
        y = polyphase(x.astype(np.float32), self.p, self.q)
        first = (self._done - self._start) * self.q // self.p
        return y[first:]

    def feed(self, x: np.ndarray) -> np.ndarray:
        self._buf = np.concatenate([self._buf, x.astype(np.float32)])
        end = (self._start + len(self._buf) - self.margin) // self.p * self.p
        if end <= self._done:
            return np.zeros(0, np.float32)
        y = self._out(end)[: (end - self._done) * self.q // self.p]
        self._buf = self._buf[end - self.margin - self._start :]
        self._start, self._done = end - self.margin, end
        return y

    def flush(self) -> np.ndarray:
        """The rest (the signal ends here, followed by zeros, as torchaudio pads it)."""
        total = self._start + len(self._buf)
        if total <= self._done:
            return np.zeros(0, np.float32)
        n = -(-(total - self._done) * self.q // self.p)  # ceil, as torchaudio's length
        pad = self.margin + (-(total - self._start)) % self.p
        self._buf = np.concatenate([self._buf, np.zeros(pad, np.float32)])
        y = self._out(total + pad - self.margin)[:n]
        self._done = total
        return y
