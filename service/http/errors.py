"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
status that matches: the row of service.engine.errors' table for the exception, the same row
the gRPC servicer reads its status from."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

from starlette.responses import JSONResponse

from xattn.service.engine.engine import NotReady, Overloaded
from xattn.service.engine.errors import INTERNAL, fault_of

log = logging.getLogger(__name__)

NOT_READY_RETRY = 5.0  # seconds: Retry-After while the model loads


@dataclass(frozen=True)
class ApiError(Exception):
    """A request the API refuses, with everything its JSON body and headers need."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"
    retry_after: float | None = None  # seconds, for 429 and 503
    close: bool = False  # `Connection: close`: the request's body was not all read

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
        headers = {"Connection": "close"} if self.close else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return JSONResponse(body, status_code=self.status, headers=headers)


def bad_param(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def api_error(e: BaseException) -> ApiError:
    """The ApiError for an exception the engine, the converter or the model raised."""
    if isinstance(e, ApiError):
        return e
    fault = fault_of(e)
    if fault is None:
        log.error("request failed: %r", e)
        return ApiError(INTERNAL.http, f"internal error: {type(e).__name__}", type=INTERNAL.kind)
    retry = None
    if isinstance(e, Overloaded):
        retry = e.retry_after_ms / 1000
    elif isinstance(e, NotReady):
        retry = NOT_READY_RETRY
    param = fault.param or _param_of(str(e))
    return ApiError(fault.http, str(e), param, fault.code, fault.kind, retry)


# the form fields a model or converter error may name first ("beam_size must be ...")
OPTION_FIELDS = frozenset(
    "language prompt temperature beam_size best_of patience length_penalty hotwords "
    "vad_filter batch_size compression_ratio_threshold logprob_threshold no_speech_threshold "
    "hallucination_silence_threshold condition_on_previous_text prefix suppress_tokens "
    "clip_timestamps without_timestamps".split()
)


def _param_of(message: str) -> str | None:
    if message.startswith(("cannot decode audio", "audio", "no audio")):
        return "file"
    if "English-only" in message:
        return "model"
    word = re.match(r"[a-z_]+", message)
    return word.group() if word and word.group() in OPTION_FIELDS else None
