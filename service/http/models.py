"""Which of our models a request's `model` names, for every route of the HTTP face."""

from __future__ import annotations

from xattn.model.pipeline import Pipeline
from xattn.service.engine.engine import Engine

# OpenAI's transcription models: each means the server's default model
OPENAI_MODELS = (
    "whisper-1",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
    "gpt-4o-transcribe-diarize",
    "gpt-transcribe",
    "gpt-live-transcribe",
    "gpt-realtime-whisper",
)
HUB_PREFIXES = ("faster-whisper-", "whisper-")  # Systran/faster-whisper-base, openai/whisper-base


def pipeline_named(engine: Engine, name: str) -> Pipeline:
    """Ours by name; "" or one of OpenAI's names: the default; a hub-style name such as
    "Systran/faster-whisper-base" or "openai/whisper-base": "base" when we serve it.
    Raises UnknownModel (404 model_not_found) for anything else."""
    if not name or name in OPENAI_MODELS:
        return engine.pipeline_for("")
    names = {p.name for p in engine.pipelines}
    if name not in names:
        short = name.rsplit("/", 1)[-1]
        for prefix in HUB_PREFIXES:
            short = short.removeprefix(prefix)
        if short in names:
            name = short
    return engine.pipeline_for(name)
