"""A Realtime transcription session's configuration: OpenAI's session objects (the current
`session.update` shape and the beta `transcription_session.update` one) <-> SessionConfig,
and SessionConfig -> the StreamingRecognitionConfig of its live streams. Errors as the
`error` event's fields (EventError)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from xattn.model.audio import SAMPLE_RATE, AudioError, AudioTooLongError
from xattn.model.audio.vad import VadUnavailable
from xattn.model.decode.decoding import DecodeOptions, OptionsError
from xattn.service.engine.engine import Engine, NotReady, Overloaded
from xattn.service.engine.live import IdleTimeout, StreamOrderError
from xattn.service.http.models import pipeline_named
from xattn.v1 import transcriber_pb2 as pb

log = logging.getLogger(__name__)

LOGPROBS = "item.input_audio_transcription.logprobs"
ATTENTION = "item.input_audio_transcription.attention"  # ours: the xattn.attention events
NOISE_REDUCTIONS = ("near_field", "far_field")


class EventError(Exception):
    """An `error` event: {type, code, message, param} (event_id: the client's event)."""

    def __init__(
        self, code: str, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.kind = code, message, param, kind

    def fields(self) -> dict:
        return {"type": self.kind, "code": self.code, "message": self.message, "param": self.param}

    @staticmethod
    def of(e: BaseException) -> EventError:
        """A live stream's error as an event."""
        if isinstance(e, EventError):
            return e
        if isinstance(e, AudioTooLongError):
            return EventError("audio_too_long", str(e))
        if isinstance(e, IdleTimeout):
            return EventError("idle_timeout", f"{e}; the uncommitted audio was dropped")
        if isinstance(e, AudioError | OptionsError | StreamOrderError):
            return EventError("invalid_value", str(e))
        if isinstance(e, Overloaded):
            return EventError("server_busy", f"{e}; this audio was dropped", kind="server_error")
        if isinstance(e, NotReady | VadUnavailable):
            return EventError("unavailable", str(e), kind="server_error")
        log.error("realtime stream failed: %r", e)
        return EventError(
            "server_error", f"internal error: {type(e).__name__}", kind="server_error"
        )


@dataclass(frozen=True)
class TurnDetection:
    """server_vad's knobs (OpenAI's defaults); prefix_padding_ms is kept and reported only:
    the live policy keeps its own second of audio before speech."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500


@dataclass(frozen=True)
class SessionConfig:
    model: str = ""  # as the client named it ("" and OpenAI's names: the default model)
    pipeline: str = ""  # our model's name
    language: str = ""
    prompt: str = ""  # kept and reported; the live policy takes no prompt
    turn_detection: TurnDetection | None = TurnDetection()
    noise_reduction: str | None = None  # kept and reported; no filter runs
    logprobs: bool = False
    attention: bool = False

    @property
    def vad(self) -> bool:
        return self.turn_detection is not None

    def live_config(self) -> pb.StreamingRecognitionConfig:
        """The live stream that transcribes this session's audio (resampled to 16 kHz)."""
        config = pb.StreamingRecognitionConfig(
            encoding=pb.PCM_ENCODING_FLOAT32,
            sample_rate=SAMPLE_RATE,
            language=self.language,
            model=self.pipeline,
            alignment=pb.AlignmentOptions(
                mode=pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS
                if self.attention
                else pb.ALIGNMENT_MODE_NONE
            ),
        )
        if self.turn_detection is not None:
            config.vad = True
            config.vad_options.threshold = self.turn_detection.threshold
            config.vad_options.min_silence_duration_ms = self.turn_detection.silence_duration_ms
        return config


def _model(engine: Engine, name: str, param: str) -> str:
    """Our model for `name` (EventError model_not_found)."""
    try:
        return pipeline_named(engine, name).name
    except OptionsError as e:
        raise EventError("model_not_found", str(e), param) from None


def initial_config(engine: Engine, model: str, attention: bool) -> SessionConfig:
    """A new session's: the query's model (if any) and include=attention."""
    name = _model(engine, model, "model")
    return SessionConfig(model=model or name, pipeline=name, attention=attention)


def _get(obj: dict, key: str, kind: type, param: str) -> object:
    value = obj[key]
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        raise EventError("invalid_type", f"{param} must be {kind.__name__}", param)
    return value


def _turn_detection(
    value: object, current: TurnDetection | None, param: str
) -> TurnDetection | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise EventError("invalid_type", f"{param} must be an object or null", param)
    kind = value.get("type", "server_vad")
    if kind != "server_vad":
        raise EventError(
            "invalid_value",
            f"{param}.type must be server_vad or turn detection null (this server has no {kind!r})",
            f"{param}.type",
        )
    base = current or TurnDetection()
    changes: dict[str, object] = {}
    for key, kind_ in (
        ("threshold", (int, float)),
        ("prefix_padding_ms", int),
        ("silence_duration_ms", int),
    ):
        if value.get(key) is not None:
            changes[key] = _get(value, key, kind_, f"{param}.{key}")  # type: ignore[arg-type]
    result = dataclasses.replace(base, **changes)
    if not 0.0 <= result.threshold <= 1.0:
        raise EventError(
            "invalid_value", f"{param}.threshold must be in [0, 1]", f"{param}.threshold"
        )
    if result.silence_duration_ms < 32 or result.prefix_padding_ms < 0:
        raise EventError(
            "invalid_value",
            f"{param}.silence_duration_ms must be >= 32 ms "
            "(one VAD chunk) and prefix_padding_ms >= 0",
            param,
        )
    return dataclasses.replace(result, threshold=float(result.threshold))


def _format(value: object, beta: bool, param: str) -> None:
    if beta:
        if value != "pcm16":
            raise EventError(
                "invalid_value",
                f"{param} must be pcm16 (24 kHz mono 16-bit "
                f"little-endian; G.711 is not supported), not {value!r}",
                param,
            )
        return
    if not isinstance(value, dict):
        raise EventError("invalid_type", f"{param} must be an object", param)
    if value.get("type", "audio/pcm") != "audio/pcm":
        raise EventError(
            "invalid_value",
            f"{param}.type must be audio/pcm (G.711 is not supported), not {value.get('type')!r}",
            f"{param}.type",
        )
    if value.get("rate", 24000) != 24000:
        raise EventError("invalid_value", f"{param}.rate must be 24000", f"{param}.rate")


def update_config(
    engine: Engine, config: SessionConfig, session: object, beta: bool
) -> SessionConfig:
    """`config` with what a session.update (beta: transcription_session.update) sets; the
    fields it leaves out keep their values. EventError names the first bad field (and
    nothing is applied)."""
    if not isinstance(session, dict):
        raise EventError("invalid_type", "session must be an object", "session")
    if not beta and session.get("type", "transcription") != "transcription":
        raise EventError(
            "invalid_value",
            "session.type must be transcription (this server "
            "transcribes; it holds no conversations)",
            "session.type",
        )
    p = "session." if beta else "session.audio.input."
    if beta:
        inp = session
        keys = {
            "format": "input_audio_format",
            "transcription": "input_audio_transcription",
            "noise_reduction": "input_audio_noise_reduction",
            "turn_detection": "turn_detection",
        }
    else:
        audio = session.get("audio") or {}
        inp = audio.get("input") or {} if isinstance(audio, dict) else {}
        keys = {k: k for k in ("format", "transcription", "noise_reduction", "turn_detection")}
    if not isinstance(inp, dict):
        raise EventError("invalid_type", "session.audio.input must be an object", p[:-1])
    changes: dict[str, object] = {}
    if keys["format"] in inp:
        _format(inp[keys["format"]], beta, p + keys["format"])
    if keys["turn_detection"] in inp:
        changes["turn_detection"] = _turn_detection(
            inp[keys["turn_detection"]], config.turn_detection, p + keys["turn_detection"]
        )
    if keys["noise_reduction"] in inp:
        noise = inp[keys["noise_reduction"]]
        kind = noise.get("type") if isinstance(noise, dict) else noise
        if kind is not None and kind not in NOISE_REDUCTIONS:
            raise EventError(
                "invalid_value",
                "noise_reduction.type must be near_field or far_field",
                p + keys["noise_reduction"],
            )
        changes["noise_reduction"] = kind
    transcription = inp.get(keys["transcription"])
    if transcription is not None:
        tp = p + keys["transcription"]
        if not isinstance(transcription, dict):
            raise EventError("invalid_type", f"{tp} must be an object", tp)
        if transcription.get("model") is not None:
            name = _get(transcription, "model", str, f"{tp}.model")
            changes["pipeline"] = _model(engine, name, f"{tp}.model")
            changes["model"] = name
        for key in ("language", "prompt"):
            if transcription.get(key) is not None:
                changes[key] = _get(transcription, key, str, f"{tp}.{key}")
        if changes.get("language"):
            pipe = engine.pipeline_for(str(changes.get("pipeline", config.pipeline)))
            try:
                pipe.validate(DecodeOptions(language=str(changes["language"])))
            except OptionsError as e:
                raise EventError("invalid_value", str(e), f"{tp}.language") from None
    if "include" in session:
        include = session["include"] or []
        if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
            raise EventError(
                "invalid_type", "session.include must be a list of strings", "session.include"
            )
        unknown = [i for i in include if i not in (LOGPROBS, ATTENTION)]
        if unknown:
            raise EventError(
                "invalid_value",
                f"session.include: unknown {unknown[0]!r} (this "
                f"server has {LOGPROBS}, {ATTENTION})",
                "session.include",
            )
        changes["logprobs"], changes["attention"] = LOGPROBS in include, ATTENTION in include
    return dataclasses.replace(config, **changes)


def session_json(config: SessionConfig, session_id: str, beta: bool) -> dict:
    """The session object of session.created/updated (beta: transcription_session.*)."""
    td = config.turn_detection
    turn = None if td is None else {"type": "server_vad", **dataclasses.asdict(td)}
    transcription = {"model": config.model, "language": config.language, "prompt": config.prompt}
    noise = None if config.noise_reduction is None else {"type": config.noise_reduction}
    include = [i for i, on in ((LOGPROBS, config.logprobs), (ATTENTION, config.attention)) if on]
    if beta:
        return {
            "id": session_id,
            "object": "realtime.transcription_session",
            "input_audio_format": "pcm16",
            "input_audio_transcription": transcription,
            "input_audio_noise_reduction": noise,
            "turn_detection": turn,
            "modalities": ["text"],
            "include": include,
            "client_secret": None,
        }
    return {
        "type": "transcription",
        "id": session_id,
        "object": "realtime.transcription_session",
        "include": include,
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": transcription,
                "noise_reduction": noise,
                "turn_detection": turn,
            }
        },
    }
