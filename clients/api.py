"""The xattn client library: stream a transcription with its cross-attention rows.

Five lines::

    from xattn.clients.api import connect

    with connect("127.0.0.1:50051") as client:
        result = client.transcribe("jfk.flac", words=True)
    print(result.text, result.windows[0].matrix().shape)  # (n_tokens, 1, 1500)

Streaming: `client.stream_transcribe(...)` yields `WindowStarted`, `Token` (with `.row`,
`[n_heads, 1500]` float32, and `.peak_frame`), `WindowDiscarded`, `Segment` and, last,
`Finished(result)`. `Result.windows[i].tokens` grows token by token while streaming; a
`WindowDiscarded` drops that window's tokens of the rejected attempt.

Errors: `AudioFileError` (the local file), `Unreachable` (no server, or it is not ready),
`ServerError` (the server answered with a gRPC status; `.code` is its name).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import grpc

from xattn.clients.assemble import Assembler, decode_tensor
from xattn.clients.balancing import RETRY_POLICY, channel_options, channel_target
from xattn.clients.data import (
    Event,
    Finished,
    Head,
    ModelInfo,
    Result,
    Segment,
    Token,
    Window,
    WindowDiscarded,
    WindowStarted,
    Word,
)
from xattn.clients.options import OFF, Options
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

__all__ = [
    "AudioFileError",
    "Client",
    "Event",
    "Finished",
    "OFF",
    "ModelInfo",
    "Options",
    "RETRY_POLICY",
    "Result",
    "Segment",
    "ServerError",
    "Token",
    "Unreachable",
    "Window",
    "WindowDiscarded",
    "WindowStarted",
    "Word",
    "XattnError",
    "connect",
    "open_channel",
    "decode_tensor",
    "read_audio",
]

log = logging.getLogger(__name__)

Alignment = Literal["mean", "all", "none"] | Sequence[Head]
DTYPES = {"float16": pb.DATA_TYPE_FLOAT16, "float32": pb.DATA_TYPE_FLOAT32}


class XattnError(Exception):
    """Base of the client's errors."""


class AudioFileError(XattnError):
    """The local audio file is missing, unreadable or empty."""


class Unreachable(XattnError):
    """No server answers at the address (or it never became ready)."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(f"cannot reach server at {address}: {detail}")
        self.address = address
        self.detail = detail


class ServerError(XattnError):
    """The server answered with an error status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code: str = code.name
        self.details = details


def read_audio(source: str | Path | bytes) -> bytes:
    """A file's bytes (bytes pass through); AudioFileError says what is wrong."""
    if isinstance(source, bytes | bytearray):
        if not source:
            raise AudioFileError("the audio is empty (0 bytes)")
        return bytes(source)
    path = Path(source)
    if not path.exists():
        raise AudioFileError(f"no such file: {path}")
    if not path.is_file():
        raise AudioFileError(f"not a file: {path}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise AudioFileError(f"cannot read {path}: {e.strerror or e}") from e
    if not data:
        raise AudioFileError(f"the file is empty (0 bytes): {path}")
    return data


def alignment_options(alignment: Alignment, dtype: str) -> pb.AlignmentOptions:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {dtype!r}")
    options = pb.AlignmentOptions(data_type=DTYPES[dtype])
    if alignment == "mean":
        options.mode = pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS
    elif alignment == "all":
        options.mode = pb.ALIGNMENT_MODE_ALL_HEADS
    elif alignment == "none":
        options.mode = pb.ALIGNMENT_MODE_NONE
    elif isinstance(alignment, str):
        raise ValueError(f"alignment must be 'mean', 'all', 'none' or heads, not {alignment!r}")
    else:
        options.mode = pb.ALIGNMENT_MODE_HEADS
        options.heads.extend(pb.AttentionHead(layer=la, head=h) for la, h in alignment)
    return options


def model_info(msg: pb.GetModelInfoResponse) -> ModelInfo:
    d = msg.dims
    return ModelInfo(
        name=msg.model_name,
        n_text_layer=d.n_text_layer,
        n_text_head=d.n_text_head,
        n_text_state=d.n_text_state,
        n_text_ctx=d.n_text_ctx,
        n_audio_ctx=d.n_audio_ctx,
        n_audio_state=d.n_audio_state,
        n_audio_layer=d.n_audio_layer,
        n_audio_head=d.n_audio_head,
        n_mels=d.n_mels,
        n_vocab=d.n_vocab,
        alignment_heads=tuple((h.layer, h.head) for h in msg.alignment_heads),
        languages=tuple(msg.languages),
        multilingual=msg.multilingual,
        frames_per_second=msg.alignment_frames_per_second or 50,
        compute_type=msg.compute_type,
        device=msg.device,
        compute_exact=msg.compute_exact,
        compute_note=msg.compute_note,
    )


def _raise_for(e: grpc.RpcError, address: str) -> None:
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        raise Unreachable(address, details or "unavailable") from e
    raise ServerError(code, details) from e


class Client:
    """A channel to one xattn server. Use `connect()`; close it (or use `with`)."""

    def __init__(self, address: str, channel: grpc.Channel) -> None:
        self.address = address
        self._channel = channel
        self._stub = transcriber_pb2_grpc.TranscriberStub(channel)
        self._infos: dict[str, ModelInfo] = {}  # by requested model name ("" = default)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def info(self, ready_timeout: float = 60.0, model: str = "") -> ModelInfo:
        """GetModelInfo (of `model`, "" = the server's default), waiting up to `ready_timeout`
        s while the server loads its models."""
        if model in self._infos:
            return self._infos[model]
        deadline = time.monotonic() + ready_timeout
        while True:
            try:
                reply = self._stub.GetModelInfo(pb.GetModelInfoRequest(model=model))
                self._infos[model] = model_info(reply)
                return self._infos[model]
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    _raise_for(e, self.address)
                log.info("server at %s not ready (%s); waiting", self.address, e.details())
                time.sleep(0.25)

    def stream_transcribe(
        self,
        audio: str | Path | bytes,
        language: str | None = None,
        words: bool = False,
        alignment: Alignment = "mean",
        dtype: str = "float16",
        temperatures: Sequence[float] = (),
        options: Options | None = None,
        model: str = "",
    ) -> Iterator[Event]:
        """Yield events as the server streams them; the last is `Finished(result)`.
        `options`: the rest of openai-whisper's and faster-whisper's options (Options);
        `model`: which of the server's models ("" = its default)."""
        data = read_audio(audio)
        info = self.info(model=model)
        request = pb.StreamTranscribeRequest(
            model=model,
            audio=pb.Audio(encoded=data),
            options=pb.TranscriptionOptions(
                language=language or "", word_timestamps=words, temperatures=temperatures
            ),
            alignment=alignment_options(alignment, dtype),
        )
        if options is not None:
            options.apply(request.options)
        heads: list[Head] | None
        if alignment == "all":
            heads = [(la, h) for la in range(info.n_text_layer) for h in range(info.n_text_head)]
        elif isinstance(alignment, str):
            heads = None
        else:
            heads = [(int(la), int(h)) for la, h in alignment]
        assembler = Assembler(info, heads)
        call = self._stub.StreamTranscribe(request)
        try:
            for response in call:
                yield from assembler.feed(response)
        except grpc.RpcError as e:
            _raise_for(e, self.address)
        finally:
            call.cancel()  # no-op when the stream ended; frees the server if we stop early
        if assembler.result is None:
            raise ServerError(grpc.StatusCode.UNKNOWN, "the stream ended without `done`")

    def transcribe(
        self,
        audio: str | Path | bytes,
        language: str | None = None,
        words: bool = False,
        alignment: Alignment = "mean",
        dtype: str = "float16",
        temperatures: Sequence[float] = (),
        options: Options | None = None,
        model: str = "",
    ) -> Result:
        """`stream_transcribe` to its end; the Result."""
        events = self.stream_transcribe(
            audio, language, words, alignment, dtype, temperatures, options=options, model=model
        )
        for event in events:
            if isinstance(event, Finished):
                return event.result
        raise ServerError(grpc.StatusCode.UNKNOWN, "the stream ended without `done`")


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call."""

    def __init__(self, token: str) -> None:
        self._entry = ("authorization", f"Bearer {token}")

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return details._replace(metadata=(*(details.metadata or ()), self._entry))  # type: ignore[attr-defined]

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any
    ) -> Any:
        return continuation(self._with_token(details), request)


def resolve_token(token: str | None, token_file: str | Path | None) -> str | None:
    """`token`, else the first line of `token_file` that is neither blank nor a #comment (the
    server's --auth-token-file format), else None. Raises OSError or ValueError."""
    if token or not token_file:
        return token
    lines = (line.strip() for line in Path(token_file).read_text().splitlines())
    token = next((t for t in lines if t and not t.startswith("#")), None)
    if token is None:
        raise ValueError(f"no token in {token_file}")
    return token


def open_channel(address: str, ca_file: str | Path | None = None) -> grpc.Channel:
    """A channel to one server or several (see `connect`), balanced by `round_robin`, with
    gRPC's retries of UNAVAILABLE and RESOURCE_EXHAUSTED (`RETRY_POLICY`); not yet connected."""
    where = channel_target(address)
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        *channel_options(),
    ]
    if where.authority:
        options.append(("grpc.default_authority", where.authority))
    if ca_file is not None:
        credentials = grpc.ssl_channel_credentials(Path(ca_file).read_bytes())
        return grpc.secure_channel(where.target, credentials, options=options)
    return grpc.insecure_channel(where.target, options=options)


def connect(
    address: str = "127.0.0.1:50051",
    ca_file: str | Path | None = None,
    timeout: float = 5.0,
    token: str | None = None,
) -> Client:
    """Open a channel to `address` and wait up to `timeout` s for it to connect.

    `address`: `host:port`; several, comma-separated (`h1:50051,h2:50051`); or any gRPC
    target (`dns:///xattn-headless.ns.svc:50051`, `ipv4:10.0.0.1:50051,10.0.0.2:50051`).
    Calls are spread over every address by `round_robin`, and retried (on the next ready
    address) on UNAVAILABLE and RESOURCE_EXHAUSTED before the first response, after the
    server's pushback: see `RETRY_POLICY`. With `ca_file` the channel is TLS, trusting that
    PEM CA bundle. With `token` every call carries `authorization: Bearer <token>` (servers
    started with --auth-token). Raises Unreachable (also for an address that does not parse).
    """
    try:
        channel = open_channel(address, ca_file)
    except ValueError as e:
        raise Unreachable(address, str(e)) from e
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError as e:
        channel.close()
        raise Unreachable(address, f"no answer within {timeout:g} s") from e
    if token:
        channel = grpc.intercept_channel(channel, _BearerToken(token))
    return Client(address, channel)
