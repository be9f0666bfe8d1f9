"""Voice activity on a live stream: Silero chunk by chunk, speech begins and ends as events.

The same network and hysteresis as `xattn.model.audio.vad.speech_spans` (a chunk at or above
`threshold` starts speech; speech ends after `min_silence_duration_ms` of chunks below
`neg_threshold`), run as the audio arrives: the LSTM state and the 64 samples of context carry
from one feed to the next, so the probabilities equal those of the whole stream at once.
Speech padding and the minimum speech duration are offline notions and do not apply.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from xattn.model.audio.vad import CHUNK, CONTEXT, SAMPLE_RATE, VadOptions, load_vad

BEGIN, END, END_OF_UTTERANCE = "begin", "end", "end_of_utterance"
LIVE_VAD = VadOptions()  # faster-whisper's: 2 s of silence end speech (a pause does not)


@dataclass(frozen=True)
class SpeechEvent:
    """Speech began ("begin", at its first chunk) or ended ("end", at the start of the
    silence that ended it); "end_of_utterance": single_utterance is over."""

    kind: str
    time: float  # seconds on the stream's clock


class StreamingVad:
    """Feed 16 kHz mono float32 in any pieces; get SpeechEvents as soon as they are known."""

    def __init__(self, options: VadOptions = LIVE_VAD) -> None:
        options.check()
        self.options = options
        self.neg = options.neg_threshold
        if self.neg is None:
            self.neg = max(options.threshold - 0.15, 0.01)
        self.min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
        self.net = load_vad()
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None  # the LSTM's (h, c)
        self.context = np.zeros(CONTEXT, dtype=np.float32)  # the last 64 samples seen
        self.rest = np.zeros(0, dtype=np.float32)  # samples short of a whole chunk
        self.chunks = 0  # chunks classified so far
        self.speaking = False
        self.began = 0  # sample where the current speech began
        self.silence_from: int | None = None  # sample where the current silence began
        self.speech_total = 0  # samples of speech that has ended
        self.voiced_until = 0  # end of the last chunk at or above neg_threshold while speaking

    @property
    def speech_seconds(self) -> float:
        """Seconds called speech so far (the current speech up to the newest chunk)."""
        ongoing = self.chunks * CHUNK - self.began if self.speaking else 0
        return (self.speech_total + ongoing) / SAMPLE_RATE

    def feed(self, audio: np.ndarray) -> list[SpeechEvent]:
        audio = np.concatenate([self.rest, np.asarray(audio, dtype=np.float32)])
        n = len(audio) // CHUNK
        self.rest = audio[n * CHUNK :]
        if n == 0:
            return []
        chunks = torch.from_numpy(audio[: n * CHUNK].copy()).view(n, CHUNK)  # [n, 512]
        context = torch.empty(n, CONTEXT)  # [n, 64]
        context[0] = torch.from_numpy(self.context)
        context[1:] = chunks[:-1, -CONTEXT:]
        self.context = audio[n * CHUNK - CONTEXT : n * CHUNK].copy()
        with torch.inference_mode():
            probs, self.state = self.net(torch.cat([context, chunks], dim=1), self.state)
        events = []
        for p in probs.tolist():
            events.extend(self._chunk(p))
            self.chunks += 1
        return events

    def _chunk(self, p: float) -> list[SpeechEvent]:
        here = self.chunks * CHUNK
        if p >= self.options.threshold:
            self.silence_from, self.voiced_until = None, here + CHUNK
            if not self.speaking:
                self.speaking, self.began = True, here
                return [SpeechEvent(BEGIN, here / SAMPLE_RATE)]
        elif p >= self.neg and self.speaking:
            self.voiced_until = here + CHUNK
        elif self.speaking:
            if self.silence_from is None:
                self.silence_from = here
            if here - self.silence_from >= self.min_silence:
                end, self.silence_from, self.speaking = self.silence_from, None, False
                self.speech_total += end - self.began
                return [SpeechEvent(END, end / SAMPLE_RATE)]
        return []
