"""stream=true: Server-Sent Events as OpenAI's streaming transcription sends them.

`transcript.text.delta` events (`delta`), each sent as soon as its token is decoded (a beam
search's early tokens included), then one `transcript.text.done` with the whole `text`.
Deltas are the decoded text of the tokens, held back only while a UTF-8 character is split
across tokens, so they concatenate to the transcript's text. With the temperature fallback,
an attempt that is rejected has had its deltas sent already: an `xattn.window_discarded`
event says which window's text to drop, and `done.text` is always the final text.

With `include[]=attention` (ours) every token is a delta (timestamp tokens and end-of-text
with an empty `delta`) carrying `xattn`: the token and its row, `{"shape": [1, n_rows, 1500],
...}`; each window opens with an `xattn.window` event (its offset and frames).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from xattn.model.decode.tokenizer import Tokenizer
from xattn.service.http.errors import api_error
from xattn.service.http.forms import FormRequest
from xattn.service.http.shapes import tensor, text_of
from xattn.v1 import transcriber_pb2 as pb

Response = pb.StreamTranscribeResponse


class Deltas:
    """Token ids -> text deltas that concatenate to the decoded text of all of them."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending: list[int] = []
        self._started = False  # the first text is sent without its leading space

    def push(self, token: int) -> str:
        if token >= self._tokenizer.eot:  # specials and timestamps have no text
            return ""
        self._pending.append(token)
        text = self._tokenizer.decode(self._pending)
        if text.endswith("\ufffd"):  # a UTF-8 character split across tokens: wait for the rest
            return ""
        self._pending = []
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        return text


def _event(body: dict) -> str:
    """One SSE event: a `data:` line of JSON (JSON has no raw newlines), then a blank line."""
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _token(t: pb.Token) -> dict:
    return {"index": t.index, "id": t.id, "window": t.window, "early": t.early}


async def sse_events(
    responses: AsyncGenerator[Response, None], request: FormRequest, deltas: Deltas
) -> AsyncIterator[str]:
    """The run's StreamTranscribeResponse messages -> SSE events."""
    logprobs: list[dict] = []
    try:
        async with aclosing(responses) as events:  # closed with us: the run stops at once
            async for r in events:
                kind = r.WhichOneof("event")
                if kind == "token":
                    text = deltas.push(r.token.id)
                    if not text and not request.attention:
                        continue
                    body: dict = {"type": "transcript.text.delta", "delta": text}
                    if request.logprobs and text:
                        entry = {"token": text, "logprob": r.token.logprob,
                                 "bytes": list(text.encode("utf-8"))}  # fmt: skip
                        body["logprobs"] = [entry]
                        logprobs.append(entry)
                    if request.attention:
                        body["xattn"] = {"tokens": [_token(r.token)]}
                        if r.token.HasField("alignment"):
                            row = r.token.alignment  # [n_rows, 1500]
                            rows = pb.Tensor(
                                shape=[1, *row.shape], data_type=row.data_type, data=row.data
                            )
                            body["xattn"]["attention"] = tensor(rows)
                    yield _event(body)
                elif kind == "window_start" and request.attention:
                    w = r.window_start
                    yield _event(
                        {
                            "type": "xattn.window",
                            "window": w.window,
                            "offset": w.offset,
                            "num_frames": w.num_frames,
                            "language": w.language,
                        }  # fmt: skip
                    )
                elif kind == "window_discarded":
                    d = r.window_discarded
                    yield _event(
                        {
                            "type": "xattn.window_discarded",
                            "window": d.window,
                            "temperature": d.temperature,
                            "reason": d.reason,
                        }  # fmt: skip
                    )
                elif kind == "done":
                    done: dict = {
                        "type": "transcript.text.done",
                        "text": text_of(r.done.transcript),
                    }
                    if request.logprobs:
                        done["logprobs"] = logprobs
                    yield _event(done)
    except Exception as e:  # after the headers: the error travels as an event
        error = api_error(e)
        yield _event({"type": "error", "error": json.loads(error.response().body)["error"]})
