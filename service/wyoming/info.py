"""`describe` -> `info`: one ASR program (xattn) listing every model the engine serves, with
the languages each takes (an English-only model "en", a multilingual one Whisper's)."""

from __future__ import annotations

from importlib import metadata

from wyoming.info import AsrModel, AsrProgram, Attribution, Info

from xattn.model.pipeline import Pipeline

PROGRAM = "xattn"
WHISPER = Attribution(name="OpenAI", url="https://github.com/openai/whisper")
XATTN = Attribution(name="xattn", url="")  # no public home yet


def _version() -> str | None:
    try:
        return metadata.version("xattn")
    except metadata.PackageNotFoundError:  # run from a source tree without installing
        return None


def model_info(pipe: Pipeline) -> AsrModel:
    kind = "multilingual" if pipe.is_multilingual else "English-only"
    return AsrModel(
        name=pipe.name,
        description=f"Whisper {pipe.name} ({kind}; {pipe.compute} on {pipe.device})",
        attribution=WHISPER,
        installed=True,
        version=None,
        languages=list(pipe.languages),
    )


def describe(pipelines: tuple[Pipeline, ...], streaming: bool) -> Info:
    """The `info` answer: the models (the default first) and whether transcripts stream."""
    program = AsrProgram(
        name=PROGRAM,
        description="Whisper speech recognition (exact; streams words while they are spoken)"
        if streaming
        else "Whisper speech recognition (exact, one transcript at audio-stop)",
        attribution=XATTN,
        installed=True,
        version=_version(),
        models=[model_info(p) for p in pipelines],
        supports_transcript_streaming=streaming,
    )
    return Info(asr=[program])
