"""gRPC results -> OpenAI's response shapes, field for field, plus the rows (ours).

json: `{"text", "usage"}`; verbose_json: `{"task", "language", "duration", "text",
"segments"[], "words"[], "usage"}` with OpenAI's segment fields (`id, seek, start, end, text,
tokens, temperature, avg_logprob, compression_ratio, no_speech_prob`) and words (`word,
start, end`); text, srt and vtt as whisper writes them, a cue per segment. The top-level
text has no leading space, as OpenAI's; segments keep whisper's.

Rows (`include[]=attention`): each window's tokens x frames matrix as
`{"shape": [n_tokens, n_rows, 1500], "dtype": "float16", "data": base64}` of little-endian,
row-major values: the bytes of the proto's Tensor, unchanged.
"""

from __future__ import annotations

import base64
import math
from datetime import timedelta

import srt

from xattn.model.net.dims import ModelDims
from xattn.service.engine.rows import WIRE_DTYPES
from xattn.service.http.forms import FormRequest
from xattn.service.http.languages import language_name
from xattn.v1 import transcriber_pb2 as pb

DTYPE_NAMES = {pb.DATA_TYPE_FLOAT16: "float16", pb.DATA_TYPE_FLOAT32: "float32"}
TEXT_TYPES = {
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def tensor(t: pb.Tensor) -> dict:
    """A proto Tensor as JSON: its shape, dtype name and base64 little-endian data."""
    assert t.data_type in WIRE_DTYPES
    return {
        "shape": list(t.shape),
        "dtype": DTYPE_NAMES[t.data_type],
        "data": base64.b64encode(t.data).decode("ascii"),
    }


def text_of(t: pb.Transcript) -> str:
    """The transcript's text as the API gives it: without whisper's leading space (kept
    otherwise as decoded, so that the stream's deltas concatenate to it exactly)."""
    return t.text.lstrip()


def usage(duration: float) -> dict:
    return {"type": "duration", "seconds": math.ceil(duration)}


def segment(s: pb.Segment) -> dict:
    return {
        "id": s.id,
        "seek": s.seek,
        "start": s.start,
        "end": s.end,
        "text": s.text,
        "tokens": list(s.tokens),
        "temperature": s.temperature,
        "avg_logprob": s.avg_logprob,
        "compression_ratio": s.compression_ratio,
        "no_speech_prob": s.no_speech_prob,
    }


def words(t: pb.Transcript) -> list[dict]:
    return [
        {"word": w.word.strip(), "start": w.start, "end": w.end}
        for s in t.segments
        for w in s.words
    ]


def window(w: pb.WindowAlignment, heads: str | list[list[int]]) -> dict:
    return {
        "window": w.window,
        "offset": w.offset,
        "num_frames": w.num_frames,
        "token_indices": list(w.token_indices),
        "token_ids": list(w.token_ids),
        "heads": heads,
        "matrix": tensor(w.matrix),
    }


def heads_of(alignment: pb.AlignmentOptions, dims: ModelDims) -> str | list[list[int]]:
    """What a row's first axis holds: "mean" of the alignment heads, or the [layer, head]s."""
    if alignment.mode == pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS:
        return "mean"
    if alignment.mode == pb.ALIGNMENT_MODE_HEADS:
        return [[h.layer, h.head] for h in alignment.heads]
    return [[la, h] for la in range(dims.n_text_layer) for h in range(dims.n_text_head)]


def verbose(
    response: pb.TranscribeResponse, request: FormRequest, heads: str | list[list[int]]
) -> dict:
    t = response.transcript
    body: dict = {
        "task": "translate" if request.options.task == pb.TASK_TRANSLATE else "transcribe",
        "language": language_name(t.language),
        "duration": t.duration,
        "text": text_of(t),
    }
    if request.segments:
        body["segments"] = [segment(s) for s in t.segments]
    if request.words:
        body["words"] = words(t)
    body["usage"] = usage(t.duration)
    if request.attention:
        body["attention"] = [window(w, heads) for w in response.windows]
    return body


def plain(response: pb.TranscribeResponse) -> dict:
    t = response.transcript
    return {"text": text_of(t), "usage": usage(t.duration)}


def _stamp(seconds: float, marker: str) -> str:
    text = srt.timedelta_to_srt_timestamp(timedelta(milliseconds=round(seconds * 1000)))
    return text.replace(",", marker)


def subtitles(t: pb.Transcript, kind: str) -> str:
    """text, srt or vtt: a cue per segment with text, as whisper's writers."""
    if kind == "text":
        return text_of(t).rstrip() + "\n"
    cues = [s for s in t.segments if s.text.strip()]
    if kind == "srt":
        return srt.compose(
            [
                srt.Subtitle(
                    i,
                    timedelta(milliseconds=round(s.start * 1000)),
                    timedelta(milliseconds=round(s.end * 1000)),
                    s.text.strip(),
                )
                for i, s in enumerate(cues, start=1)
            ],
            reindex=False,
        )
    body = "".join(
        f"{_stamp(s.start, '.')} --> {_stamp(s.end, '.')}\n{s.text.strip()}\n\n" for s in cues
    )
    return "WEBVTT\n\n" + body
