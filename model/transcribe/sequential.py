"""Whole-file transcription as openai-whisper's `transcribe()` does it, as a generator.

The log-mel of the file (plus 30 s of padding) is cut into windows at `seek`; each window is
encoded once, its cross-attention K/V cached, and decoded with temperature fallback. The
seek advances by the window's last timestamp, exactly as the reference does, so segment
boundaries match it. Events are yielded in order: WindowStart, TokenEvent…, (WindowDiscarded
and more TokenEvents on fallback), Segment…, and finally the Transcript.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from xattn.model.audio.features import (
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    log_mel_spectrogram,
)
from xattn.model.decode.beams import window_decoder
from xattn.model.decode.decoding import (
    DecodeOptions,
    LogitRules,
    WindowResult,
    detect_language,
)
from xattn.model.decode.prompts import seek_clips, suppressed_ids, window_tokens
from xattn.model.decode.results import Segment, TokenEvent, Transcript, WindowDiscarded, WindowStart
from xattn.model.decode.step_batcher import StepBatcher, model_work
from xattn.model.decode.step_batcher import encode as encode_window
from xattn.model.decode.tokenizer import TIME_PRECISION, Tokenizer
from xattn.model.net.kv_cache import KVCache
from xattn.model.net.whisper import Whisper
from xattn.model.transcribe.alignment import online_token_time
from xattn.model.transcribe.hallucination import last_end as hallucination_last_end
from xattn.model.transcribe.hallucination import skip_silence
from xattn.model.transcribe.words import Piece, WordAligner

log = logging.getLogger(__name__)
Event = WindowStart | TokenEvent | WindowDiscarded | Segment | Transcript
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # mel frames: 100
INPUT_STRIDE = 2  # mel frames per encoder frame


@dataclass(frozen=True)
class Context:
    """What a transcription needs besides audio and options."""

    model: Whisper
    tokenizer: Tokenizer
    suppress: tuple[int, ...]
    suppress_blank: tuple[int, ...]
    aligner: WordAligner | None
    batcher: StepBatcher | None = None  # cached steps batched with other threads' decodes


def needs_fallback(r: WindowResult, o: DecodeOptions) -> str | None:
    """Why this attempt is rejected (None: accept it)."""
    too_repetitive = o.compression_ratio_threshold is not None and (
        r.compression_ratio > o.compression_ratio_threshold
    )
    if too_repetitive:
        reason = "compression_ratio"
    elif o.logprob_threshold is not None and r.avg_logprob < o.logprob_threshold:
        reason = "avg_logprob"
    else:
        return None
    silent = o.no_speech_threshold is not None and r.no_speech_prob > o.no_speech_threshold
    if silent and o.logprob_threshold is not None and r.avg_logprob < o.logprob_threshold:
        return None  # silence: keep it, the window will be skipped
    return reason


def rules_for(ctx: Context, options: DecodeOptions) -> Callable[..., LogitRules]:
    """LogitRules for every window of one transcription, but `sample_begin` (the length of
    each window's initial tokens): the suppress lists as asked, the timestamp rules."""
    tok, device = ctx.tokenizer, ctx.model.device
    suppress = ctx.suppress
    if options.suppress_tokens != (-1,):
        suppress = suppressed_ids(options.suppress_tokens, ctx.suppress, tok.task_ids)
    blank = ctx.suppress_blank if options.suppress_blank else ()
    max_initial = options.max_initial_timestamp  # 0 or None: no limit, as openai-whisper
    return partial(
        LogitRules,
        suppress=torch.tensor(suppress, dtype=torch.long, device=device),
        suppress_blank=torch.tensor(blank, dtype=torch.long, device=device),
        eot=tok.eot,
        timestamp_begin=tok.timestamp_begin,
        no_timestamps=tok.no_timestamps,
        max_initial_timestamp_index=round(max_initial / TIME_PRECISION) if max_initial else None,
        timestamps=not options.without_timestamps,
    )


def split_segments(
    tokens: list[int], ts_begin: int, time_offset: float, segment_size: int
) -> tuple[list[Piece], int, bool]:
    """The window's segments, how far to advance `seek` (mel frames), and whether the window
    ended on a single timestamp (no speech after it)."""
    is_ts = [t >= ts_begin for t in tokens]
    single_ending = is_ts[-2:] == [False, True]
    consecutive = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    if not consecutive:
        stamps = [t for t in tokens if t >= ts_begin]
        duration = segment_size * HOP_LENGTH / SAMPLE_RATE
        if stamps and stamps[-1] != ts_begin:
            duration = (stamps[-1] - ts_begin) * TIME_PRECISION
        return (
            [Piece(time_offset, time_offset + duration, tuple(tokens))],
            segment_size,
            single_ending,
        )
    pieces, last = [], 0
    for cut in consecutive + ([len(tokens)] if single_ending else []):
        piece = tokens[last:cut]
        start = time_offset + (piece[0] - ts_begin) * TIME_PRECISION
        pieces.append(
            Piece(start, time_offset + (piece[-1] - ts_begin) * TIME_PRECISION, tuple(piece))
        )
        last = cut
    advance = segment_size if single_ending else (tokens[last - 1] - ts_begin) * INPUT_STRIDE
    return pieces, advance, single_ending


def decode_with_fallback(
    ctx: Context,
    features: torch.Tensor,
    cache: KVCache,
    initial: tuple[int, ...],
    rules: LogitRules,
    options: DecodeOptions,
    window: int,
    token_index: int,
    time_offset: float,
    num_frames: int,
    generator: torch.Generator | None = None,
) -> Generator[TokenEvent | WindowDiscarded, None, tuple[WindowResult, int]]:
    """Decode a window at each temperature until one attempt passes the thresholds: beam
    search at 0, best-of sampling above (xattn.model.decode.beams.window_decoder), drawing from
    `generator` (one per transcription; None: options.seed's)."""
    tok = ctx.tokenizer
    heads = np.array(ctx.aligner.heads if ctx.aligner else [])  # [n_heads, 2]
    sot_index = initial.index(tok.sot)
    for i, t in enumerate(options.temperatures):
        decode = window_decoder(options, t)
        steps = decode(
            *(ctx.model, features, cache, tok, initial, sot_index, rules, t, options),
            *(ctx.batcher, generator),
        )
        while True:
            try:
                step = next(steps)
            except StopIteration as stop:
                result: WindowResult = stop.value
                break
            pos = step.token - tok.timestamp_begin
            stamp = pos * TIME_PRECISION if pos >= 0 else None
            text = tok.token_text(step.token)
            online = None
            if options.online_timestamps and len(heads):
                row = step.attention[heads[:, 0], heads[:, 1]].mean(0)  # [1500]
                online = round(time_offset + online_token_time(row, num_frames=num_frames), 2)
            attention = step.attention if options.return_attention else None
            yield TokenEvent(
                *(token_index, step.token, text, step.logprob, window, t, stamp, online),
                *(attention, step.early),
            )
            token_index += 1
        reason = needs_fallback(result, options)
        if reason is None or i == len(options.temperatures) - 1:
            return result, token_index
        yield WindowDiscarded(window, t, reason)
    raise ValueError("no temperatures to decode with")


Encode = Callable[[int, torch.Tensor], tuple[torch.Tensor, KVCache]]


def open_tail(tokens: list[int], pieces: list[Piece], eot: int) -> bool:
    """Whether a window's tokens end with text after its last complete segment (an open
    segment, which the next window decodes again)."""
    return any(t < eot for t in tokens[sum(len(p.tokens) for p in pieces) :])


def resume_point(
    pieces: list[Piece],
    seek: int,
    window_seek: int,
    time_offset: float,
    after: float,
    single_ending: bool,
) -> tuple[int, int]:
    """(how many of a window's segments to keep, where the next window starts) when its audio is
    joined speech: more than `after` seconds without a segment, between two of them or, in a
    window that ended on a single timestamp, after the last one up to the window's end
    (`seek`), is speech the decoder skipped; the segments before it are kept and the next
    window starts at the end of the last of them. Otherwise all of them and `seek`. A gap
    before the first segment is left (a window from the same place would decode the same)
    (pure)."""

    def frames(t: float) -> int:  # a time of the window -> frames into it
        return round((t - time_offset) * FRAMES_PER_SECOND)

    for i in range(1, len(pieces)):
        end = pieces[i - 1].end
        if pieces[i].start - end > after and frames(end) > 0:
            return i, window_seek + frames(end)
    if not single_ending or not pieces:
        return len(pieces), seek
    end = frames(pieces[-1].end)
    if end <= 0 or (seek - window_seek - end) / FRAMES_PER_SECOND <= after:
        return len(pieces), seek
    return len(pieces), window_seek + end


def transcribe(
    ctx: Context,
    audio: np.ndarray,
    options: DecodeOptions,
    encode: Encode | None = None,
    keep_open_tails: bool = False,
    resume_after: float | None = None,
    min_tail: float = 0.0,
) -> Generator[Event, None, None]:
    """Yield every event of the transcription of `audio` (16 kHz mono float32). `encode`:
    (seek, the window's mel [n_mels, <= 3000], unpadded) -> its encoder output [1, 1500, d]
    and K/V cache (the batched pipeline's, which encodes first windows together); None: here,
    one by one.
    `keep_open_tails`: a window after one that ended with an open segment is never skipped as
    silence (the batched pipeline's chunks, whose last window is often that short tail; the
    reference skips it). `resume_after` (seconds): where a window's segments leave more than
    this much of its audio without text (between two segments, or after the last one of a
    window that ended on a single timestamp), the segments after that gap are dropped and the
    next window starts at the end of the one before it (`resume_point`), where the reference
    keeps them and goes on from the window's end (the batched pipeline's chunks are joined
    speech: audio the decoder passed over is speech it skipped); None: never. `min_tail`
    (seconds): a window after the first that would hold less audio than this, all of it the
    last of the file, is not decoded (whisper.cpp's rule: under a second left ends the decode;
    the batched pipeline's chunks, whose ends are a span's padding); 0: every window, as the
    reference."""
    model, tok = ctx.model, ctx.tokenizer
    device = model.device
    run = model_work(ctx.batcher)
    dtype = next(model.parameters()).dtype
    # on the model thread too, with a batcher: torch work from other threads brings its own
    # OpenMP team onto the same cores (xattn.model.decode.step_batcher)
    mel = run(log_mel_spectrogram, audio, model.dims.n_mels, N_SAMPLES, device)
    content_frames = mel.shape[-1] - N_FRAMES  # [n_mels, content + 3000]
    duration = content_frames * HOP_LENGTH / SAMPLE_RATE

    language = options.language
    if language is None and tok.multilingual:  # once, on the first 30 s, as the reference
        first = mel[None, :, :N_FRAMES].to(dtype)  # [1, n_mels, 3000]: at least 30 s were padded
        language, _ = run(lambda: detect_language(model, model.encoder(first), tok))
        log.debug("detected language %s", language)
    language = language or "en"
    sot_sequence = tok.sot_sequence(language, options.task)
    window_rules = rules_for(ctx, options)
    all_tokens: list[int] = []
    if options.initial_prompt:
        all_tokens = tok.encode(" " + options.initial_prompt.strip())
    n_initial_prompt = len(all_tokens)
    segments: list[Segment] = []
    prompt_reset_since, window, token_index = 0, 0, 0
    last_speech = 0.0
    after_open = False  # the previous window ended with an open segment
    n_ctx = model.dims.n_text_ctx
    generator = torch.Generator().manual_seed(options.seed)  # every window's samples
    threshold = options.hallucination_silence_threshold if options.word_timestamps else None
    clips = seek_clips(options.clip_timestamps, content_frames)
    clip, seek = 0, clips[0][0]

    while clip < len(clips):  # openai-whisper's loop over the clips, flattened as there
        clip_start, clip_end = clips[clip]
        seek = max(seek, clip_start)
        if seek >= clip_end:
            clip += 1
            if clip < len(clips):
                seek = clips[clip][0]
            continue
        if window > 0 and content_frames - seek < min_tail * FRAMES_PER_SECOND:
            left = (content_frames - seek) / FRAMES_PER_SECOND
            log.debug("%.2f s left after window %d: not decoded", left, window)
            seek = content_frames
            continue
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE
        segment_size = min(N_FRAMES, content_frames - seek, clip_end - seek)
        window_mel = mel[:, seek : seek + segment_size]  # [n_mels, <= 3000]
        if encode is None:
            # [1, 1500, d], and the cross-attention K/V: once per window; the padding to 3000
            # frames in the same turn on the model thread (a window's copy is a parallel op)
            features, cache = encode_window(ctx.batcher, model, window_mel[None].to(dtype))
        else:
            features, cache = encode(seek, window_mel)
        num_frames = segment_size // INPUT_STRIDE
        yield WindowStart(window, time_offset, num_frames, language)

        initial = window_tokens(
            sot_sequence=sot_sequence,
            previous=all_tokens[prompt_reset_since:],
            sot_prev=tok.sot_prev,
            no_timestamps=tok.no_timestamps,
            n_text_ctx=n_ctx,
            encode=tok.encode,
            prefix=options.prefix if window == 0 else None,
            hotwords=options.hotwords,
            without_timestamps=options.without_timestamps,
        )
        rules = window_rules(sample_begin=len(initial))
        result, token_index = yield from decode_with_fallback(
            ctx,
            features,
            cache,
            initial,
            rules,
            options,
            window,
            token_index,
            time_offset,
            num_frames,
            generator,
        )
        skip = options.no_speech_threshold is not None and (
            result.no_speech_prob > options.no_speech_threshold
        )
        if skip and options.logprob_threshold is not None:
            skip = result.avg_logprob <= options.logprob_threshold
        if skip and keep_open_tails and after_open:
            skip = False  # the words the previous window left open
        if skip:  # silence: fast-forward to the next window
            seek += segment_size
            window += 1
            continue

        pieces, advance, single_ending = split_segments(
            list(result.tokens), tok.timestamp_begin, time_offset, segment_size
        )
        window_seek, seek = seek, seek + advance
        after_open = not single_ending and open_tail(list(result.tokens), pieces, tok.eot)
        if resume_after is not None:
            keep, seek = resume_point(
                pieces, seek, window_seek, time_offset, resume_after, single_ending
            )
            if keep < len(pieces):  # words skipped after pieces[keep - 1]: decoded next
                pieces, single_ending, after_open = pieces[:keep], False, True
        words: list[tuple] = [() for _ in pieces]
        timings: list[tuple] = [() for _ in pieces]
        if options.word_timestamps and ctx.aligner is not None:
            pieces, words, timings, last_end = run(
                ctx.aligner.align,
                *(cache, sot_sequence, pieces, num_frames, language, time_offset, last_speech),
                *(options.prepend_punctuations, options.append_punctuations),
            )
            if last_end is not None and not single_ending and last_end > time_offset:
                seek = round(last_end * FRAMES_PER_SECOND)
            if threshold is not None:
                bounds = [(p.start, p.end) for p in pieces]
                seek, keep = skip_silence(
                    bounds,
                    words,
                    threshold=threshold,
                    seek=seek,
                    window_seek=window_seek,
                    segment_size=segment_size,
                    single_ending=single_ending,
                    last_speech=last_speech,
                    content_frames=content_frames,
                )
                if keep is None:  # a hallucination after a long silence: skip to it
                    window += 1
                    continue
                pieces, words, timings = pieces[:keep], words[:keep], timings[:keep]
                last_end = hallucination_last_end(bounds[:keep], words)
            if last_end is not None:
                last_speech = last_end

        for piece, piece_words, piece_timings in zip(pieces, words, timings, strict=True):
            text = tok.decode(list(piece.tokens))
            seg_tokens = piece.tokens
            if piece.start == piece.end or not text.strip():
                text, seg_tokens, piece_words, piece_timings = "", (), (), ()
            segment = Segment(
                id=len(segments),
                window=window,
                seek=window_seek,
                start=piece.start,
                end=piece.end,
                text=text,
                tokens=seg_tokens,
                temperature=result.temperature,
                avg_logprob=result.avg_logprob,
                compression_ratio=result.compression_ratio,
                no_speech_prob=result.no_speech_prob,
                words=tuple(piece_words),
                token_timings=tuple(piece_timings),
            )
            segments.append(segment)
            all_tokens.extend(seg_tokens)
            yield segment
        if not options.condition_on_previous_text or result.temperature > 0.5:
            prompt_reset_since = len(all_tokens)
        window += 1

    text = tok.decode(all_tokens[n_initial_prompt:])
    yield Transcript(text=text, language=language, segments=tuple(segments), duration=duration)
