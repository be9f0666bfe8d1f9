"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with the HTTP
status that matches: the same exceptions the gRPC servicer maps to statuses
(service.servicer.error_status), seen through OpenAI's eyes."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass

import grpc
from starlette.responses import JSONResponse

from xattn.service.engine import NotReady, Overloaded, UnknownModel
from xattn.service.servicer import ResultTooLarge, error_status

log = logging.getLogger(__name__)

# gRPC status -> (HTTP status, OpenAI error type)
_BY_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (413, "invalid_request_error"),
    grpc.StatusCode.UNIMPLEMENTED: (400, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (408, "timeout_error"),
}


@dataclass(frozen=True)
class ApiError(Exception):
    """A request the API refuses, with everything its JSON body and headers need."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"
    retry_after: float | None = None  # seconds, for 429 and 503

    def response(self) -> JSONResponse:
        body = {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }
        headers = {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        return JSONResponse(body, status_code=self.status, headers=headers)


def bad_param(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def api_error(e: BaseException) -> ApiError:
    """The ApiError for an exception the engine, the converter or the model raised."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, UnknownModel):
        return ApiError(404, str(e), param="model", code="model_not_found")
    if isinstance(e, Overloaded):
        return ApiError(
            429,
            str(e),
            code="server_busy",
            type="rate_limit_error",
            retry_after=e.retry_after_ms / 1000,
        )
    if isinstance(e, NotReady):
        return ApiError(503, str(e), code="not_ready", type="server_error", retry_after=5)
    if isinstance(e, ResultTooLarge):
        return ApiError(413, str(e), code="result_too_large")
    code = error_status(e)
    if code is None:
        log.error("request failed: %r", e)
        return ApiError(500, f"internal error: {type(e).__name__}", type="server_error")
    status, kind = _BY_STATUS.get(code, (400, "invalid_request_error"))
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return ApiError(status, str(e), param="file", code="audio_too_long", type=kind)
    param = _param_of(str(e))
    return ApiError(status, str(e), param=param, code=code.name.lower(), type=kind)


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
