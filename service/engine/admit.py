"""One transcription request, from its proto parts to an admitted `Run`: shared by the gRPC
servicer and the HTTP face, so both validate, default and decode alike."""

from __future__ import annotations

from xattn.service.engine import convert
from xattn.service.engine.engine import Engine, Run
from xattn.service.engine.rows import row_spec
from xattn.v1 import transcriber_pb2 as pb


def start_transcription(
    engine: Engine,
    audio: pb.Audio,
    options: pb.TranscriptionOptions,
    alignment: pb.AlignmentOptions,
    model: str,
    default_mode: int,
    stream: bool,
) -> Run:
    """Validate everything cheap, then admit; the run's events are StreamTranscribeResponse
    messages (`stream`) or one TranscribeResponse. Raises what service.engine.errors
    maps: UnknownModel, OptionsError, AudioError, NotReady, Overloaded."""
    pipe = engine.pipeline_for(model)  # UnknownModel: INVALID_ARGUMENT
    rows = row_spec(alignment, default_mode, pipe.dims, pipe.alignment_heads)
    decode = convert.decode_options(options, return_attention=rows.enabled)
    pipe.validate(decode)
    load_audio = convert.audio_loader(audio, engine.limits.max_audio_seconds, engine.decode_audio)
    shape = convert.StreamShaper(rows, pipe.tokenizer.eot) if stream else convert.UnaryShaper(rows)
    return engine.submit(load_audio, decode, shape, pipe.name)
