"""The live policy: when a token of a step's hypothesis is final (a pure function of the
hypothesis, the previous step's and the stream's clock; see xattn.model.live.transcriber).

A token is committed once it is decided, by either of two signals:
- heard: its cross-attention peak (mean over the alignment heads), and the next token's, lie
  before `edge` (the newest audio less the commit margin: the decoder has moved on past it,
  so more audio will not change it), and the previous decode did not propose a different
  token at this place (a changed mind is not yet settled);
- agreed (`agreement`): the previous decode proposed this token and the next one at the same
  place (local agreement over two tokens).
Commits stop at the first undecided token and never split a word; the last token of a
hypothesis always waits, since nothing after it shows that the decoder has moved on.

A decoder can stop short of the audio: after a sentence and a pause, continuing a forced
prefix, Whisper often proposes the sentence's full stop and the end of text, step after step,
while the next sentence is spoken (it would be skipped, or come late). `stalled` tells when
(the transcriber then commits the punctuation and starts the buffer after the last word, as
openai-whisper starts its next window after the last segment), but only when someone speaks
after that text (`voiced_after`): over silence, a window that starts after the last word invites
Whisper to repeat its prompt, where the stalled decoder was right to wait.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Timed(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def peak_time(self) -> float: ...


def commit_count(
    hypothesis: Sequence[Timed], previous: Sequence[int], edge: float, agreement: bool
) -> int:
    """How many tokens from the front of `hypothesis` are final."""
    n = 0
    for i, (t, after) in enumerate(zip(hypothesis, hypothesis[1:], strict=False)):
        proposed = previous[i] if i < len(previous) else None
        heard = t.peak_time < edge and after.peak_time < edge and proposed in (None, t.id)
        agreed = agreement and list(previous[i : i + 2]) == [t.id, after.id]
        if not (heard or agreed):
            break
        n = i + 1
    while 0 < n < len(hypothesis) and not starts_word(hypothesis[n].text):
        n -= 1  # never end a commit inside a word
    return n


def starts_word(text: str) -> bool:
    """Whether a token of this text begins a word (a space, or not a letter or digit)."""
    return text[:1] in (" ", "") or not text[:1].isalnum()


RUN = 3  # tokens in a row behind the latest peak that make a loop (one may be DTW-noise)


def monotonic_count(hypothesis: Sequence[Timed], max_jump: float | None) -> int:
    """How many tokens from the front of `hypothesis` read the audio forwards: it ends before
    the first of RUN tokens in a row whose attention peaks lie more than `max_jump` seconds
    before the latest peak before them (the decoder went back to audio it has transcribed: a
    repetition loop, whose tokens would otherwise look heard; a single token's peak can stray
    alone). None: all of them."""
    if max_jump is None:
        return len(hypothesis)
    latest, behind = -float("inf"), 0
    for i, t in enumerate(hypothesis):
        behind = behind + 1 if t.peak_time < latest - max_jump else 0
        if behind == RUN:
            return i + 1 - RUN
        if not behind:
            latest = max(latest, t.peak_time)
    return len(hypothesis)


def repeat_count(ids: Sequence[int], max_repeats: int | None, longest: int = 12) -> int:
    """How many tokens from the front of `ids` come before a repetition loop: it ends after
    the first copy of the first run of up to `longest` tokens that comes more than
    `max_repeats` times in a row ("remember remember remember ..." attends to one place, so
    `monotonic_count` lets it by). None: all of them."""
    if max_repeats is None:
        return len(ids)
    times = max_repeats + 1
    for end in range(1, len(ids) + 1):  # the first place where a loop is complete
        for p in range(1, min(longest, end // times) + 1):
            tail = ids[end - times * p : end]
            if all(tail[j] == tail[j % p] for j in range(p, times * p)):
                return end - (times - 1) * p
    return len(ids)


def stalled(rest: Sequence[Timed], ended: bool, last_heard: float | None, edge: float) -> bool:
    """Whether a step's decoder stopped short of the audio: its hypothesis ended (end of text),
    nothing of it is undecided but punctuation (`rest`), and the last text committed in the
    buffer (its latest attention peak, `last_heard`; None: none) lies before `edge`."""
    if not ended or last_heard is None or last_heard >= edge:
        return False
    return not any(c.isalnum() for t in rest for c in t.text)


ECHO = 5  # tokens: a hypothesis that begins with this many of its prompt's in a row echoes it


def echoes(ids: Sequence[int], prompt: Sequence[int], run: int = ECHO) -> bool:
    """Whether `ids` begins with `run` tokens that come in a row in `prompt` (over silence
    after a slide, Whisper tends to read its prompt again: "The hospital has followed
    protocol ..." once more)."""
    if len(ids) < run:
        return False
    head = list(ids[:run])
    return any(list(prompt[i : i + run]) == head for i in range(len(prompt) - run + 1))


FRAME = 1600  # samples: 0.1 s at 16 kHz, the loudness frame of `voiced_after`


def frame_rms(audio: np.ndarray) -> np.ndarray:
    """RMS of each whole FRAME of `audio`: [len // FRAME]."""
    n = len(audio) // FRAME
    frames = audio[: n * FRAME].reshape(n, FRAME).astype(np.float64)  # [n, FRAME]
    return np.sqrt(np.mean(np.square(frames), axis=1))  # [n]


FLOOR_DB = -100.0  # dB of full scale: a frame's floor (Whisper's log-mel floors power at 1e-10)


def frame_db(audio: np.ndarray) -> np.ndarray:
    """Loudness of each whole FRAME of `audio`, dB of full scale, at least FLOOR_DB: [n]."""
    return np.maximum(20 * np.log10(np.maximum(frame_rms(audio), 1e-10)), FLOOR_DB)


def loudness_db(audio: np.ndarray) -> float:
    """RMS of all of `audio`, dB of full scale (-200 for none or zeros)."""
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if len(audio) else 0.0
    return float(20 * np.log10(max(rms, 1e-10)))


def silent(audio: np.ndarray, below_db: float = -80.0) -> bool:
    """Whether no FRAME of `audio` (nor what is left after its last) reaches `below_db`:
    digital silence, a muted microphone. Whisper reads such a window as no speech with a
    30 s window, but guesses a word ("you") over a short one."""
    tail = audio[len(audio) // FRAME * FRAME :]
    return max([FLOOR_DB, *frame_db(audio), loudness_db(tail)]) < below_db


PAUSE = 3  # frames: 0.3 s of quiet in a row make a pause between words
QUIET = 0.3  # a quiet frame lies below this share of the way, in dB, from noise to speech


def quiet_frames(audio: np.ndarray) -> np.ndarray | None:
    """Which FRAMEs of `audio` are quiet: RMS below QUIET of the way from the 10th percentile
    of frame RMS to the 90th, in dB; None: no speech to tell them from (those lie under 6 dB
    apart)."""
    db = frame_db(audio)  # [frames]
    if len(db) < PAUSE:
        return None
    floor, speech = np.percentile(db, [10, 90])
    if speech - floor < 6.0:
        return None
    return db < floor + QUIET * (speech - floor)  # [frames]


def pause_in(audio: np.ndarray, first: int, last: int, lead: int | None = None) -> int | None:
    """The middle sample of the first pause (PAUSE quiet frames in a row) of `audio` that
    begins between samples `first` and `last` (with `lead`: `lead` samples before its end,
    where that is later); None: none, or no speech to tell it from."""
    quiet = quiet_frames(audio)
    if quiet is None:
        return None
    run, start = 0, -(-first // FRAME)  # the first whole frame from `first`
    for i in range(start, len(quiet)):
        run = run + 1 if quiet[i] else 0
        begin = i + 1 - run
        if begin * FRAME > last:
            return None
        if run == PAUSE:
            end = i + 1
            while end < len(quiet) and quiet[end]:
                end += 1
            middle = (begin + end) * FRAME // 2
            return middle if lead is None else max(middle, end * FRAME - lead)
    return None


RISE = 15.0  # dB: a frame this far above the quiet floor is a voice, however far the speaker


def voiced_after(audio: np.ndarray, split: int, below_db: float = 6.0) -> bool:
    """Whether `audio[split:]` holds a 0.1 s frame within `below_db` of the speech before
    `split` (its loudest tenth of frames: the 90th percentile of frame loudness), or RISE dB
    above the quiet floor (the 10th percentile of frame loudness, before or after `split`,
    whichever is lower): a quieter speaker after a loud one (live_scale's streams join
    recordings 40 dB apart) is someone speaking, where a pause's noise stays within a few dB
    of its floor."""
    before, after = frame_db(audio[:split]), frame_db(audio[split:])
    if not len(before) or not len(after):
        return False
    quiet, speech = np.percentile(before, [10, 90])
    floor = min(float(quiet), float(np.percentile(after, 10)))
    loudest = float(after.max())
    return loudest >= float(speech) - below_db or loudest >= floor + RISE
