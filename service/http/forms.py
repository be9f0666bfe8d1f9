"""OpenAI's transcription form -> the proto's TranscriptionOptions and AlignmentOptions.

The one table from OpenAI's fields (and the extras faster-whisper-based servers accept) to
ours. Everything after it is the gRPC path: service.engine.convert turns the options into
DecodeOptions with the same defaults, so a form that sets nothing decodes as a gRPC request
that sets nothing (beam 5, best-of 5, the temperature fallback ladder). Pure functions.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import FormData, UploadFile

from xattn.service.http.errors import ApiError, bad_param
from xattn.service.http.languages import language_code
from xattn.v1 import transcriber_pb2 as pb

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("word", "segment")
INCLUDES = ("logprobs", "attention")
TEMPERATURE_STEP = 0.2  # openai-whisper's temperature_increment_on_fallback
ROW_DTYPES = {"float16": pb.DATA_TYPE_FLOAT16, "float32": pb.DATA_TYPE_FLOAT32}


@dataclass(frozen=True)
class FormRequest:
    """A parsed, checked form: the audio, the proto options, and what the answer holds."""

    audio: bytes
    model: str  # as given (service.http.models.pipeline_named finds it)
    response_format: str
    stream: bool
    words: bool  # timestamp_granularities[] has "word"
    segments: bool  # ... has "segment" (the default)
    logprobs: bool  # include[]=logprobs
    attention: bool  # include[]=attention: the rows (ours)
    options: pb.TranscriptionOptions
    alignment: pb.AlignmentOptions


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise bad_param(name, f"{name} must be true or false, not {value!r}")


def _number(kind: Callable[[str], float | int], name: str, value: str) -> float | int:
    try:
        number = kind(value.strip())
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise bad_param(name, f"{name} must be {what}, not {value!r}") from None
    if not math.isfinite(number):
        raise bad_param(name, f"{name} must be finite, not {value!r}")
    return number


def temperatures(value: str) -> list[float]:
    """openai-whisper's meaning of one temperature: the first rung of the fallback ladder
    (t, t + 0.2, ... up to 1.0), as `whisper --temperature t` decodes."""
    t = _number(float, "temperature", value)
    if not 0.0 <= t <= 1.0:
        raise bad_param("temperature", f"temperature must be between 0 and 1, not {value}")
    ladder, rung = [], float(t)
    while rung <= 1.0 + 1e-6:
        ladder.append(round(rung, 6))
        rung += TEMPERATURE_STEP
    return ladder


def _threshold(name: str, value: str) -> pb.Threshold:
    if value.strip().lower() in ("off", "none", "null"):
        return pb.Threshold(off=True)
    return pb.Threshold(value=_number(float, name, value))


def _chunking(value: str, options: pb.TranscriptionOptions) -> None:
    """chunking_strategy: "auto" or {"type": "server_vad", ...} -> vad_filter (Silero)."""
    if value.strip() == "auto":
        options.vad_filter = True
        return
    try:
        spec = json.loads(value)
    except json.JSONDecodeError:
        spec = None
    if not isinstance(spec, dict) or spec.get("type") != "server_vad":
        raise bad_param(
            "chunking_strategy", 'chunking_strategy must be "auto" or {"type": "server_vad", ...}'
        )
    options.vad_filter = True
    vad = options.vad_options
    try:
        if "threshold" in spec:
            vad.threshold = float(spec["threshold"])
        if "prefix_padding_ms" in spec:
            vad.speech_pad_ms = int(spec["prefix_padding_ms"])
        if "silence_duration_ms" in spec:
            vad.min_silence_duration_ms = int(spec["silence_duration_ms"])
    except (TypeError, ValueError):
        raise bad_param("chunking_strategy", "chunking_strategy's values must be numbers") from None


def _set(options: pb.TranscriptionOptions, field: str, kind: Callable) -> Callable:
    return lambda name, value: setattr(options, field, kind(name, value))


def _options_table(o: pb.TranscriptionOptions) -> dict[str, Callable[[str, str], None]]:
    """Form field -> how it sets `o` (OpenAI's, then faster-whisper servers' extras)."""
    text = lambda name, value: value  # noqa: E731
    integer = lambda name, value: _number(int, name, value)  # noqa: E731
    real = lambda name, value: _number(float, name, value)  # noqa: E731
    table = {
        "prompt": _set(o, "initial_prompt", text),
        "temperature": lambda name, value: o.temperatures.extend(temperatures(value)),
        "hotwords": _set(o, "hotwords", text),
        "prefix": _set(o, "prefix", text),
        "vad_filter": _set(o, "vad_filter", _bool),
        "without_timestamps": _set(o, "without_timestamps", _bool),
        "condition_on_previous_text": _set(o, "condition_on_previous_text", _bool),
        "beam_size": _set(o, "beam_size", integer),
        "best_of": _set(o, "best_of", integer),
        "batch_size": _set(o, "batch_size", integer),
        "patience": _set(o, "patience", real),
        "length_penalty": _set(o, "length_penalty", real),
        "hallucination_silence_threshold": _set(o, "hallucination_silence_threshold", real),
        "chunking_strategy": lambda name, value: _chunking(value, o),
        "suppress_tokens": lambda name, value: o.suppress_tokens.ids.extend(
            _number(int, name, v) for v in value.split(",") if v.strip()
        ),
        "clip_timestamps": lambda name, value: o.clip_timestamps.extend(
            _number(float, name, v) for v in value.split(",") if v.strip()
        ),
    }
    for name in ("compression_ratio_threshold", "logprob_threshold", "no_speech_threshold"):
        table[name] = lambda n, v, f=name: getattr(o, f).CopyFrom(_threshold(n, v))
    table["log_prob_threshold"] = table["logprob_threshold"]  # faster-whisper's spelling
    return table


def _values(form: FormData, name: str) -> list[str]:
    """A list field sent as `name[]` (OpenAI's SDKs) or `name` (curl -F name=a -F name=b)."""
    values = [*form.getlist(f"{name}[]"), *form.getlist(name)]
    if any(not isinstance(v, str) for v in values):
        raise bad_param(name, f"{name} must be text, not a file")
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_param(name, f"{name} must be text, not a file")
    return value


def _alignment(form: FormData) -> pb.AlignmentOptions:
    """attention_heads ("alignment": their mean, the default; "all"; or "L:H,L:H") and
    attention_dtype (float16, the default, or float32)."""
    heads = (_text(form, "attention_heads") or "alignment").strip()
    dtype = (_text(form, "attention_dtype") or "float16").strip()
    if dtype not in ROW_DTYPES:
        raise bad_param(
            "attention_dtype", f"attention_dtype must be float16 or float32, not {dtype!r}"
        )
    alignment = pb.AlignmentOptions(data_type=ROW_DTYPES[dtype])
    if heads == "alignment":
        alignment.mode = pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS
    elif heads == "all":
        alignment.mode = pb.ALIGNMENT_MODE_ALL_HEADS
    else:
        alignment.mode = pb.ALIGNMENT_MODE_HEADS
        for pair in heads.split(","):
            layer, sep, head = pair.partition(":")
            if not sep or not layer.strip().isdigit() or not head.strip().isdigit():
                raise bad_param(
                    "attention_heads",
                    'attention_heads must be "alignment", "all" or layer:head pairs like '
                    f'"2:1,3:0", not {heads!r}',
                )
            alignment.heads.add(layer=int(layer), head=int(head))
    return alignment


async def read_audio(form: FormData) -> bytes:
    files = [f for f in form.getlist("file") if isinstance(f, UploadFile)]
    if not files:
        raise bad_param(
            "file",
            "file is required: send the audio as a multipart file field `file`",
            "missing_file",
        )
    if len(files) > 1:
        raise bad_param("file", f"send one file, not {len(files)}", "too_many_files")
    data = await files[0].read()
    if not data:
        raise bad_param("file", "file is empty (0 bytes)", "empty_file")
    return data


async def parse_form(form: FormData, task: str) -> FormRequest:
    """The form of /v1/audio/transcriptions (task "transcribe") or /translations."""
    audio = await read_audio(form)
    options = pb.TranscriptionOptions(
        task=pb.TASK_TRANSLATE if task == "translate" else pb.TASK_TRANSCRIBE
    )
    table = _options_table(options)
    for name, set_value in table.items():
        value = _text(form, name)
        if value is not None and value.strip():
            set_value(name, value)
    language = _text(form, "language")
    if language and language.strip():
        options.language = language_code(language)  # ApiError naming `language`
    response_format = (_text(form, "response_format") or "json").strip()
    if response_format not in RESPONSE_FORMATS:
        raise bad_param(
            "response_format",
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}, "
            f"not {response_format!r}",
        )
    granularities = _values(form, "timestamp_granularities")
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_param(
                "timestamp_granularities", f"timestamp_granularities: {g!r} is not word or segment"
            )
    if granularities and response_format != "verbose_json":
        raise bad_param(
            "timestamp_granularities",
            "timestamp_granularities needs response_format=verbose_json",
        )
    includes = _values(form, "include")
    for item in includes:
        if item not in INCLUDES:
            raise bad_param("include", f"include: {item!r} is not one of {', '.join(INCLUDES)}")
    options.word_timestamps = "word" in granularities
    attention = "attention" in includes
    stream = _bool("stream", _text(form, "stream") or "false")
    if attention and not stream and response_format != "verbose_json":
        raise bad_param(
            "include", "include[]=attention needs response_format=verbose_json or stream=true"
        )
    return FormRequest(
        audio=audio,
        model=(_text(form, "model") or "").strip(),
        response_format=response_format,
        stream=stream,
        words="word" in granularities,
        segments="segment" in granularities or not granularities,
        logprobs="logprobs" in includes,
        attention=attention,
        options=options,
        alignment=_alignment(form)
        if attention
        else pb.AlignmentOptions(mode=pb.ALIGNMENT_MODE_NONE),
    )


def check_model_language(request: FormRequest, languages: tuple[str, ...], name: str) -> None:
    """400s that name `language` or `model` before the request is admitted."""
    language = request.options.language
    if language and language not in languages:
        known = ", ".join(languages[:12]) + (" …" if len(languages) > 12 else "")
        raise bad_param(
            "language",
            f"language {language!r} is not one {name} knows ({known})",
            "unsupported_language",
        )
    if request.options.task == pb.TASK_TRANSLATE and languages == ("en",):
        raise ApiError(
            400,
            f"{name} is English-only: it cannot translate; use a multilingual model",
            param="model",
            code="model_cannot_translate",
        )
