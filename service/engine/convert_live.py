"""Proto ⇄ dataclasses for live streams (StreamingRecognize): a stream's config into
LiveOptions, and LiveResults and speech events into xattn.v1 messages. Pure
functions; no gRPC, no threads (xattn.service.engine.convert holds the file requests')."""

from __future__ import annotations

import dataclasses
import math

from xattn.model.audio.vad import VadOptions, weights_path
from xattn.model.decode.beams import MAX_ROWS
from xattn.model.decode.decoding import OptionsError
from xattn.model.live.types import LiveOptions, LiveResult
from xattn.model.live.vad_stream import BEGIN, END, END_OF_UTTERANCE, LIVE_VAD, SpeechEvent
from xattn.service.engine.convert import vad_options, words
from xattn.service.engine.rows import RowSpec
from xattn.v1 import transcriber_pb2 as pb


def live_options(config: pb.StreamingRecognitionConfig, defaults: LiveOptions) -> LiveOptions:
    """The config's policy over the server's defaults (OptionsError for impossible values)."""
    policy, limit = config.policy, defaults.max_buffer
    margin, agreement, first = defaults.commit_margin, defaults.agreement, defaults.first_context
    if policy.HasField("commit_margin"):
        margin = _seconds(policy.commit_margin, "policy.commit_margin", limit)
    if policy.HasField("agreement"):
        agreement = policy.agreement
    if policy.HasField("first_context"):
        first = _seconds(policy.first_context, "policy.first_context", limit)
    beams = defaults.beam_size
    if policy.HasField("beam_size"):
        beams = policy.beam_size
        if not 1 <= beams <= MAX_ROWS:
            raise OptionsError(f"policy.beam_size must be in 1..{MAX_ROWS}, not {beams}")
    return dataclasses.replace(
        defaults,
        language=config.language or defaults.language,
        commit_margin=margin,
        agreement=agreement,
        first_context=first,
        beam_size=beams,
        return_attention=True,
        vad=live_vad(config),
        single_utterance=config.single_utterance,
    )


def _seconds(value: float, name: str, limit: float) -> float:
    if not math.isfinite(value) or not 0 <= value <= limit:
        raise OptionsError(f"{name} must be in 0..{limit:g} s, not {value}")
    return value


def live_vad(config: pb.StreamingRecognitionConfig) -> VadOptions | None:
    """The config's voice activity detection: None without `vad` (OptionsError for
    single_utterance without it, or parameters out of range)."""
    if config.single_utterance and not config.vad:
        raise OptionsError("config.single_utterance needs config.vad (speech ends the utterance)")
    if not config.vad:
        return None
    weights_path()  # VadUnavailable (UNIMPLEMENTED) on a server without silero-vad
    return vad_options(config.vad_options, LIVE_VAD)


SPEECH_EVENTS = {
    BEGIN: pb.SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_BEGIN,
    END: pb.SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_END,
    END_OF_UTTERANCE: pb.SPEECH_EVENT_TYPE_END_OF_SINGLE_UTTERANCE,
}


def speech_event(event: SpeechEvent) -> pb.StreamingRecognizeResponse:
    return pb.StreamingRecognizeResponse(
        speech_event=pb.SpeechEvent(type=SPEECH_EVENTS[event.kind], time=event.time)
    )


def live_result(result: LiveResult, first: int, rows: RowSpec) -> pb.StreamingRecognizeResponse:
    """A LiveResult as a message; its tokens are numbered from `first` on."""
    msg = pb.StreamingRecognitionResult(
        is_final=result.is_final,
        stability=result.stability,
        text=result.text,
        buffer_offset=result.buffer_offset,
        audio_seconds=result.audio_seconds,
        words=words(result.words),
    )
    for i, t in enumerate(result.tokens):
        token = msg.tokens.add(
            index=first + i, id=t.id, text=t.text, logprob=t.logprob, peak_time=t.peak_time
        )
        if rows.enabled and t.attention is not None:
            token.alignment.CopyFrom(rows.tensor(rows.select(t.attention)))
    return pb.StreamingRecognizeResponse(result=msg)
