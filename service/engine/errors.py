"""One table from what a request can fail with to what every face answers.

Each face (gRPC, HTTP, Wyoming) reads its status from the `Fault` of the exception: the gRPC
status name, the HTTP status with OpenAI's error type and code, and the code the faces without
statuses of their own (Wyoming's `error` event) send. An exception that is in no row is a bug:
the faces answer INTERNAL / 500 and log it.
"""

from __future__ import annotations

from dataclasses import dataclass

from xattn.model.audio.features import AudioError, AudioTooLongError
from xattn.model.audio.vad import VadUnavailable
from xattn.model.decode.decoding import OptionsError
from xattn.service.engine.engine import NotReady, Overloaded, UnknownModel
from xattn.service.engine.live import IdleTimeout, StreamOrderError


class ResultTooLarge(RuntimeError):
    """A Transcribe result over the send limit (ask for fewer rows, or stream)."""


class MalformedMessage(ValueError):
    """Bytes that are not a message of the face's protocol (a binary WebSocket frame where
    JSON text is due, a line that is not an event): an error, then the connection closes."""


class ClientTimeout(TimeoutError):
    """A client that sent nothing, half a request or half a message for longer than the
    server waits (the header, body or idle timeout): the connection closes."""


class ClientGone(ConnectionError):
    """The client hung up mid-request: no one to answer, logged as a hang-up (not an error)."""


@dataclass(frozen=True)
class Fault:
    """How every face reports one kind of failure."""

    grpc: str  # grpc.StatusCode's name
    http: int  # HTTP status
    kind: str  # OpenAI's error type
    code: str  # OpenAI's error code; Wyoming's error code
    param: str | None = None  # the form field it names, when it is always the same one
    retry: bool = False  # the client may retry later (a hint comes with Overloaded)


# most specific first: UnknownModel is an OptionsError, AudioTooLongError an AudioError
TABLE: tuple[tuple[type[BaseException], Fault], ...] = (
    (UnknownModel, Fault("INVALID_ARGUMENT", 404, "invalid_request_error", "model_not_found",
                         "model")),
    (AudioTooLongError, Fault("OUT_OF_RANGE", 413, "invalid_request_error", "audio_too_long",
                              "file")),
    (AudioError, Fault("INVALID_ARGUMENT", 400, "invalid_request_error", "invalid_argument")),
    (OptionsError, Fault("INVALID_ARGUMENT", 400, "invalid_request_error", "invalid_argument")),
    (StreamOrderError, Fault("INVALID_ARGUMENT", 400, "invalid_request_error",
                             "invalid_argument")),
    (IdleTimeout, Fault("DEADLINE_EXCEEDED", 408, "timeout_error", "deadline_exceeded")),
    (NotReady, Fault("UNAVAILABLE", 503, "server_error", "not_ready", retry=True)),
    (Overloaded, Fault("RESOURCE_EXHAUSTED", 429, "rate_limit_error", "server_busy",
                       retry=True)),
    (ResultTooLarge, Fault("RESOURCE_EXHAUSTED", 413, "invalid_request_error",
                           "result_too_large")),
    # the client errors every face meets, with the codes of their engine-side kin
    (MalformedMessage, Fault("INVALID_ARGUMENT", 400, "invalid_request_error",
                             "invalid_argument")),
    (ClientTimeout, Fault("DEADLINE_EXCEEDED", 408, "timeout_error", "deadline_exceeded")),
    (ClientGone, Fault("CANCELLED", 499, "invalid_request_error", "client_closed")),
    # a feature this server was installed without
    (VadUnavailable, Fault("UNIMPLEMENTED", 400, "invalid_request_error", "unimplemented")),
)  # fmt: skip

INTERNAL = Fault("INTERNAL", 500, "server_error", "internal_error")


def fault_of(e: BaseException) -> Fault | None:
    """The fault an exception maps to; None for an unexpected one (INTERNAL, logged)."""
    for kind, fault in TABLE:
        if isinstance(e, kind):
            return fault
    return None
