"""Live recognition: audio arrives as it is spoken; tokens are committed once they are decided.

The policy (AlignAtt with local agreement), run each time `feed` brings new audio:
1. The buffer (audio since `buffer_offset`, at most `max_buffer` s) is encoded as one 30 s
   window, or with `encode_margin` as its front (buffer + margin seconds, at least
   `encode_floor`) and its last second alone (xattn.model.live.window): a step then costs
   what its buffer needs. Whisper's encoder cannot run on the new audio alone: every
   frame attends to every other, positions are absolute and the log-mel is normalised by the
   buffer's maximum, so a new sample changes every frame.
2. The decoder continues after the text already committed in this buffer (forced as a
   prefix) and the text committed before it (the prompt), greedy, without timestamps.
3. A token is committed once it is decided (heard or agreed: xattn.model.live.policy).
4. When the buffer grows past `max_buffer`, it slides to the end of the last committed word;
   the committed text moves into the prompt. It slides there too when the decoder stopped
   short (xattn.model.live.policy.stalled: it ended the text with `stall` seconds or more of
   audio after the last committed word; its pending punctuation is committed first).
`finish` decodes what is left and commits everything. Finals are never revised.

A buffer with nothing above -80 dBFS (a muted microphone) runs no step: Whisper reads
nothing there over a 30 s window and guesses "you" over a short one.
With `gate_db`, a feed whose new audio is quieter than that (RMS, dB of full scale) runs no
step once the last step left nothing undecided: nothing new was heard.
`urgency` tells a scheduler how much a step of this stream is due (who goes next is not
decided here).

With `vad` (xattn.model.live.vad_stream), Silero runs on every feed first: while nobody speaks no
decode runs (the silent buffer is not re-encoded; it slides to keep PRE_ROLL seconds), speech
beginning and ending come out as SpeechEvents before the feed's results, and the end of speech
commits the utterance at once (a `finish` of the buffer); with `single_utterance` the stream is
over after it (`over`: later feeds are ignored).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from xattn.model.audio.features import SAMPLE_RATE
from xattn.model.decode.beams import window_decoder
from xattn.model.decode.decoding import DecodeOptions, LogitRules, detect_language
from xattn.model.decode.results import FRAMES_PER_SECOND, WordTiming
from xattn.model.decode.step_batcher import encode, model_turn, model_work
from xattn.model.live.policy import (
    FRAME,
    commit_count,
    echoes,
    loudness_db,
    monotonic_count,
    pause_in,
    quiet_frames,
    repeat_count,
    silent,
    stalled,
    voiced_after,
)
from xattn.model.live.types import LiveOptions, LiveResult, LiveStats, LiveToken
from xattn.model.live.vad_stream import BEGIN, END, END_OF_UTTERANCE, SpeechEvent, StreamingVad
from xattn.model.live.window import full_rows, kept_frames, tail_frames, window_frame, window_mel
from xattn.model.transcribe.alignment import find_alignment, token_probabilities
from xattn.model.transcribe.sequential import Context

PRE_ROLL = 1.0  # seconds of silence kept before speech when the buffer slides over silence
LEAD = 0.3  # seconds of a pause a stall's slide keeps before the speech after it
AFTER_WORD = 0.1  # seconds from a word's DTW end to where the audio after it begins
DETECT_AFTER = 3.0  # seconds of audio from which a detected language is kept


class LiveTranscriber:
    """Feed PCM (16 kHz mono float32); get interim and final results."""

    def __init__(self, ctx: Context, heads: tuple[tuple[int, int], ...], options: LiveOptions):
        self.ctx, self.options = ctx, options
        self.heads = np.array(heads)  # [n_heads, 2]
        self.audio = np.zeros(0, dtype=np.float32)  # the stream from sample `base` on
        self.base = 0  # samples dropped from the front of `audio` (before the buffer)
        self.offset = 0  # sample where the buffer starts
        self.prompt: list[int] = []  # committed before the buffer
        self.committed: list[LiveToken] = []  # committed inside the buffer
        self.previous: list[int] = []  # the last decode's uncommitted hypothesis
        self._rest: list[LiveToken] | None = None  # ... its tokens; None: no decode of the buffer
        self.decoded_at = 0  # samples received at the last decode
        self.language = options.language or (None if ctx.tokenizer.multilingual else "en")
        self._detect = self.language is None  # detect it again each step until DETECT_AFTER s
        self.finals: list[LiveResult] = []
        self.stats = LiveStats()
        self.vad = StreamingVad(options.vad) if options.vad is not None else None
        self.over = False  # single_utterance: the utterance ended
        self._heard = False  # vad: speech began since the buffer last held only finals
        self._ended = False  # the last decode ended its text (end of text, not a cut)

    @property
    def samples(self) -> int:
        """Samples received so far."""
        return self.base + len(self.audio)

    @property
    def received(self) -> float:
        return self.samples / SAMPLE_RATE

    def feed(self, audio: np.ndarray) -> list[LiveResult | SpeechEvent]:
        if self.over:
            return []
        self.audio = np.concatenate([self.audio, audio.astype(np.float32)])
        if self.vad is not None:
            return self._feed_vad(audio)
        if self.samples - self.decoded_at < self.options.min_step * SAMPLE_RATE:
            return []
        if self._quiet():
            self.stats.skipped_steps += 1
            self.decoded_at = self.samples
            return []
        return self._timed(final=False)

    @property
    def urgency(self) -> float:
        """How much a step of this stream is due, for a scheduler's order (larger first):
        seconds of audio received since the last step, plus one while the last step left
        tokens undecided (words wait for it to commit). Cheap: no model work."""
        unheard = (self.samples - self.decoded_at) / SAMPLE_RATE
        return unheard + (1.0 if self.previous else 0.0)

    def _quiet(self) -> bool:
        """Nothing to hear: the buffer is silent (policy.silent), or (gate_db) the audio since
        the last step is below the gate and nothing waits."""
        if silent(self.audio[self.offset - self.base :]):
            return True
        gate = self.options.gate_db
        if gate is None or self.previous:
            return False
        return loudness_db(self.audio[max(0, self.decoded_at - self.base) :]) < gate

    def feed_in_turn(self, take: Callable[[], np.ndarray]) -> list[LiveResult | SpeechEvent]:
        """`feed(take())` in a turn of the model thread (StepBatcher.turn): the audio is taken
        once the work queued before this step has run, so a step that waited for other
        streams decodes what arrived meanwhile, and its model work then runs without work
        queued after it in between."""
        with model_turn(self.ctx.batcher):
            return self.feed(take())

    def finish(self, take: Callable[[], np.ndarray] | None = None) -> list[LiveResult]:
        """Decode what is left and commit all of it. `take` (without vad): the audio that came
        after the last step, taken in the turn, joins the buffer without a step of its own (a
        stream that ends waits for one decode, not two)."""
        if self.over or (self.vad is not None and not self._pending_speech()):
            return []
        with model_turn(self.ctx.batcher):
            if take is not None:
                assert self.vad is None, "vad: the rest goes through feed"
                self.audio = np.concatenate([self.audio, take().astype(np.float32)])
            if silent(self.audio[self.offset - self.base :]):
                return []  # nothing was heard (nothing of it was committed either)
            return self._timed(final=True)

    def _feed_vad(self, audio: np.ndarray) -> list[LiveResult | SpeechEvent]:
        events: list[LiveResult | SpeechEvent] = list(self.vad.feed(audio))
        self._heard = self._heard or any(e.kind == BEGIN for e in events)
        due = self.samples - self.decoded_at >= self.options.min_step * SAMPLE_RATE
        if events and events[-1].kind == END:  # the utterance is over: commit it now
            end = events[-1].time
            events.extend(self._timed(final=True) if self._pending_speech() else [])
            self._after_utterance(end)
            if self.options.single_utterance:
                self.over = True
                events.append(SpeechEvent(END_OF_UTTERANCE, self.received))
            return events
        if not self._voiced_since_decode:
            if due:  # silence: no decode (nor after speech, until it ends or resumes)
                self.stats.skipped_steps += 1
                self.decoded_at = self.samples
            if not self.vad.speaking and not self.committed and not self.previous:
                self._after_utterance()  # the buffer slides over the silence
            return events
        return events + (self._timed(final=False) if due else [])

    @property
    def _voiced_since_decode(self) -> bool:
        """Whether the VAD heard speech after the last decode (False without vad)."""
        return self.vad is not None and self.vad.voiced_until > self.decoded_at

    def _pending_speech(self) -> bool:
        """Whether the buffer may hold speech not yet final (vad)."""
        return bool(self.committed or self.previous or self._heard)

    def _after_utterance(self, end: float = 0.0) -> None:
        """Everything is final: the text moves to the prompt, the buffer keeps PRE_ROLL s but
        nothing before `end` (where the speech ended: its last word, heard again after its
        text moved to the prompt, was read twice: "fellow American Americans")."""
        self.prompt.extend(t.id for t in self.committed)
        self.committed, self.previous, self._rest, self._heard = [], [], None, False
        keep = max(self.samples - int(PRE_ROLL * SAMPLE_RATE), round(end * SAMPLE_RATE))
        self.offset = min(self.samples, max(self.offset, keep))
        self.audio = self.audio[self.offset - self.base :]
        self.base = self.offset

    def _timed(self, final: bool) -> list[LiveResult]:
        t0 = time.perf_counter()
        results = list(self._step(final))
        self.stats.step_seconds += time.perf_counter() - t0
        return results

    def _step(self, final: bool) -> Iterator[LiveResult]:
        if final and self._rest is not None and self._settled():
            hypothesis = self._rest  # what came since the last decode is quiet: it stands
        else:
            self.decoded_at = self.samples
            self.stats.steps += 1
            hypothesis = self._decode()
            hypothesis = hypothesis[: monotonic_count(hypothesis, self.options.max_jump)]
            hypothesis = hypothesis[
                : repeat_count([t.id for t in hypothesis], self.options.max_repeats)
            ]
        if final:  # tokens after the last one looking into the audio guess about the padding
            heard = [i for i, t in enumerate(hypothesis) if t.peak_time <= self.received + 0.1]
            hypothesis = hypothesis[: heard[-1] + 1] if heard else []
        n = len(hypothesis) if final else self._commit_count(hypothesis)
        stall = None if final else self._stalled(hypothesis, n)
        n = len(hypothesis) if stall is not None else n  # what is left is punctuation: final
        if n:
            yield self._finalise(hypothesis[:n], hypothesis[n:])
        rest = hypothesis[n:]
        if rest and not final:
            agreed = sum(1 for a, b in zip(rest, self.previous, strict=False) if a.id == b)
            yield LiveResult(
                is_final=False,
                tokens=tuple(rest),
                text=self.ctx.tokenizer.decode([t.id for t in rest]),
                stability=agreed / len(rest),
                buffer_offset=self.offset / SAMPLE_RATE,
                audio_seconds=self.received,
            )
        self.previous, self._rest = [t.id for t in rest], rest
        if stall is not None or (
            not final and (self.samples - self.offset) / SAMPLE_RATE > self.options.max_buffer
        ):
            self._slide(stall)

    def _settled(self) -> bool:
        """Whether the audio since the last decode is quiet (policy.quiet_frames over the
        buffer, every whole frame of it): decoding it again would read the same words (the
        silence a satellite sends before audio-stop)."""
        if self._voiced_since_decode:
            return False  # speech went on after it: its last word may have been cut there
        buffer = self.audio[self.offset - self.base :]
        quiet = quiet_frames(buffer)
        first = -(-(self.decoded_at - self.offset) // FRAME)  # the first whole frame after it
        return quiet is not None and bool(quiet[first:].all())

    def _stalled(self, hypothesis: list[LiveToken], n: int) -> int | None:
        """policy.stalled for this step (`n` tokens of `hypothesis` are about to be
        committed): the sample where the buffer then starts, None: no stall. There: in the
        pause after the last word, at most LEAD s before the speech after it (DTW stretches a
        last word over a pause and into untranscribed speech after it, or ends it early, and a
        buffer that starts inside a word misreads it: the pause is sought up to `stall` s after
        the word's attention peak), else at its DTW end; and only when someone speaks after
        it."""
        if self.options.stall is None:
            return None
        heard = [
            t.peak_time for t in (*self.committed, *hypothesis[:n]) if t.peak_time <= self.received
        ]
        last = max(heard, default=None)
        if not stalled(hypothesis[n:], self._ended, last, self.received - self.options.stall):
            return None
        assert last is not None
        words = self._words(0, hypothesis[:n])
        end = words[-1].end if words else last
        buffer = self.audio[self.offset - self.base :]
        seek = max(end + AFTER_WORD, last + self.options.stall)  # DTW can end a word early
        at = [round(s * SAMPLE_RATE) - self.offset for s in (last, end + AFTER_WORD, seek)]
        split = pause_in(buffer, at[0], at[2], round(LEAD * SAMPLE_RATE))
        split = at[1] if split is None else split
        return split + self.offset if voiced_after(buffer, split) else None

    @torch.inference_mode()
    def _decode(self) -> list[LiveToken]:
        ctx, tok, model = self.ctx, self.ctx.tokenizer, self.ctx.model
        run = model_work(ctx.batcher)  # on the model thread, with a batcher: as a file's work
        t0 = time.perf_counter()
        buffer = self.audio[self.offset - self.base :]
        mel, content = run(window_mel, buffer, model.dims.n_mels)  # [1, n_mels, 3000]
        frames = kept_frames(content, self.options.encode_margin, self.options.encode_floor)
        tail = tail_frames(frames)
        mel = mel[..., :frames].to(model.device)  # [1, n_mels, frames]
        features, cache = encode(  # [1, F, d]: F = frames / 2 + tail
            ctx.batcher, model, mel, frames, self.options.precision, tail
        )
        encoded = features.shape[1]
        self.stats.encode_seconds += time.perf_counter() - t0
        self.stats.encoder_frames += encoded
        if self._detect:  # on the first second or two of audio, detection is a guess
            self.language, _ = run(detect_language, model, features, tok)
            self._detect = self.received < DETECT_AFTER and not (self.committed or self.prompt)
        self._cache, self._frames = cache, content // 2
        sot = (*tok.sot_sequence(self.language), tok.no_timestamps)
        prompt = self.prompt[-(model.dims.n_text_ctx // 2 - 1) :]
        initial = (*((tok.sot_prev, *prompt) if prompt else ()), *sot)
        initial = (*initial, *(t.id for t in self.committed))
        rules = LogitRules(
            sample_begin=len(initial),
            suppress=torch.tensor(ctx.suppress),
            suppress_blank=torch.tensor(ctx.suppress_blank),
            eot=tok.eot,
            timestamp_begin=tok.timestamp_begin,
            no_timestamps=tok.no_timestamps,
            max_initial_timestamp_index=None,
            timestamps=False,
        )
        room = min(model.dims.n_text_ctx - len(initial) - 1, 224)
        if self.options.tokens_per_second is not None:
            seconds = len(buffer) / SAMPLE_RATE
            room = min(room, int(seconds * self.options.tokens_per_second) + 16)
        beams = self.options.beam_size
        options = DecodeOptions(
            return_attention=True, sample_len=max(1, room), beam_size=beams, best_of=beams
        )
        steps = window_decoder(options, 0.0)(
            *(model, features, cache, tok, initial, initial.index(tok.sot), rules, 0.0),
            *(options, ctx.batcher),
        )
        tokens, self._ended = [], False
        while True:
            try:
                step = next(steps)
            except StopIteration as stop:
                result = stop.value
                break
            self.stats.decoder_steps += 1
            if step.token == tok.eot:
                self._ended = True
                continue
            row = step.attention[self.heads[:, 0], self.heads[:, 1]].mean(0)  # [F]
            frame = window_frame(int(row.argmax()), encoded, tail)
            peak = (self.offset / SAMPLE_RATE) + frame / FRAMES_PER_SECOND
            keep = full_rows(step.attention, tail) if self.options.return_attention else None
            text = tok.token_text(step.token)
            tokens.append(LiveToken(step.token, text, step.logprob, peak, keep))
            ids = [t.id for t in tokens[-3 * 12 :]]  # a loop ends with the newest token
            looped = repeat_count(ids, self.options.max_repeats) < len(ids)
            if looped or monotonic_count(tokens, self.options.max_jump) < len(tokens):
                steps.close()  # a loop back over heard audio: _step cuts it, stop decoding it
                return tokens
        if result.no_speech_prob > 0.6 and result.avg_logprob < -1.0:
            return []  # silence, by openai-whisper's rule
        if not self.committed and echoes([t.id for t in tokens], self.prompt):
            return []  # a new buffer read as its prompt again: Whisper's guess over silence
        return tokens

    def _commit_count(self, hypothesis: list[LiveToken]) -> int:
        first = self.options.first_context
        if first is not None and not (self.prompt or self.committed):  # the first words
            return commit_count(hypothesis, self.previous, self.received - first, False)
        edge = self.received - self.options.commit_margin
        return commit_count(hypothesis, self.previous, edge, self.options.agreement)

    def _finalise(self, tokens: list[LiveToken], rest: list[LiveToken]) -> LiveResult:
        """Commit `tokens`; their words are timed beside the `rest` of the hypothesis (a text
        that covers the audio, else DTW stretches the last committed words over the rest)."""
        before = len(self.committed)
        self.committed.extend(tokens)
        words = self._words(before, rest, upto=len(self.committed))
        return LiveResult(
            is_final=True,
            tokens=tuple(tokens),
            text=self.ctx.tokenizer.decode([t.id for t in tokens]),
            stability=1.0,
            buffer_offset=self.offset / SAMPLE_RATE,
            audio_seconds=self.received,
            words=words,
        )

    @torch.inference_mode()
    def _words(
        self, first_new: int, extra: Sequence[LiveToken] = (), upto: int | None = None
    ) -> tuple[WordTiming, ...]:
        """Words of the committed tokens and `extra` after them, timed together by DTW over the
        buffer's alignment heads (stream clock): those from token `first_new` on that end by
        token `upto` (None: all)."""
        tok = self.ctx.tokenizer
        text = [t.id for t in (*self.committed, *extra)]
        prefix = [*tok.sot_sequence(self.language), tok.no_timestamps]
        sequence = [*prefix, *text, tok.eot]

        def align() -> list:  # on the model thread, with a batcher: its softmax and filters
            logits, scores = self.ctx.aligner.scores(self._cache, sequence)  # are parallel ops
            probs = token_probabilities(logits, n_prefix=len(prefix), text_tokens=text, eot=tok.eot)
            words, _, _ = find_alignment(
                scores,
                num_frames=max(1, self._frames),
                n_prefix=len(prefix),
                text_tokens=text,
                text_token_probs=probs,
                language=self.language,
                decode_with_timestamps=tok.decode_with_timestamps,
                eot=tok.eot,
            )
            return words

        words = model_work(self.ctx.batcher)(align)
        offset, out, seen = self.offset / SAMPLE_RATE, [], 0
        last = len(text) if upto is None else upto
        for w in words:
            # a final's words: not a stall's lone full stop (a slide reads where it ends)
            spoken = upto is None or any(c.isalnum() for c in w.word)
            if seen >= first_new and seen + len(w.tokens) <= last and spoken:
                start, end = round(offset + w.start, 2), round(offset + w.end, 2)
                out.append(WordTiming(w.word, start, end, w.probability, w.tokens))
            seen += len(w.tokens)
        return tuple(out)

    def _slide(self, to: int | None = None) -> None:
        """Move the buffer's start to sample `to`, None: the end of the last committed word."""
        if to is None:
            words = self._words(0) if self.committed else ()
            end = words[-1].end if words else self.received - self.options.commit_margin
            to = int(end * SAMPLE_RATE)
        self.offset = min(self.samples, max(self.offset, to))
        self.audio = self.audio[self.offset - self.base :]  # the rest is never read again
        self.base = self.offset
        self.prompt.extend(t.id for t in self.committed)
        self.committed, self.previous, self._rest = [], [], None
