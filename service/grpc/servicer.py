"""xattn.v1.Transcriber on grpc.aio: requests in, engine runs, messages out. Nothing else."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from xattn.model.decode.decoding import OptionsError
from xattn.service.engine import convert
from xattn.service.engine.admit import start_transcription
from xattn.service.engine.engine import Engine, NotReady, Overloaded, Run
from xattn.service.engine.errors import ResultTooLarge, fault_of
from xattn.service.engine.live import LiveSession, live_settings
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

try:  # rich error details (google.rpc.RetryInfo) when googleapis-common-protos is installed
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2
except ImportError:  # pragma: no cover
    status_pb2 = None

log = logging.getLogger(__name__)

RETRY_AFTER_KEY = "retry-after-ms"
PUSHBACK_KEY = "grpc-retry-pushback-ms"  # gRPC's retry design (A6): the server's pushback
Context = grpc.aio.ServicerContext
Request = pb.TranscribeRequest | pb.StreamTranscribeRequest


def error_status(e: BaseException) -> grpc.StatusCode | None:
    """The status a request error maps to (service.engine.errors); None for unexpected ones
    (INTERNAL)."""
    fault = fault_of(e)
    return grpc.StatusCode[fault.grpc] if fault is not None else None


def retry_metadata(e: Overloaded) -> tuple[tuple[str, str | bytes], ...]:
    """The retry hint three ways: `retry-after-ms`; `grpc-retry-pushback-ms`, which gRPC's
    built-in retries (a service config's retryPolicy) obey; and google.rpc.RetryInfo in
    grpc-status-details-bin when available."""
    delay_ms = str(e.retry_after_ms)
    metadata: list[tuple[str, str | bytes]] = [
        (RETRY_AFTER_KEY, delay_ms),
        (PUSHBACK_KEY, delay_ms),
    ]
    if status_pb2 is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(e.retry_after_ms)
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        status = status_pb2.Status(
            code=code_pb2.RESOURCE_EXHAUSTED, message=str(e), details=[detail]
        )
        metadata.append(("grpc-status-details-bin", status.SerializeToString()))
    return tuple(metadata)


async def abort_for(context: Context, e: BaseException) -> None:
    """Abort the RPC with the status `e` maps to (logs unexpected errors)."""
    code = error_status(e)
    if code is None:
        log.error("request failed: %r", e)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(e).__name__}")
    trailing = retry_metadata(e) if isinstance(e, Overloaded) else ()
    await context.abort(code, str(e), trailing_metadata=trailing)


class TranscriberServicer(transcriber_pb2_grpc.TranscriberServicer):
    """Thin: validation and shaping live in service.engine.convert, running in the engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._live = live_settings(engine.limits)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: Context
    ) -> pb.GetModelInfoResponse:
        engine = self._engine
        try:
            pipe = engine.pipeline_for(request.model)
            return convert.model_info(
                pipe, engine.limits, engine.pipelines, engine.workers_for, engine.live_streams_for
            )
        except (NotReady, OptionsError) as e:
            await abort_for(context, e)
            raise  # unreachable: abort raises

    async def Transcribe(
        self, request: pb.TranscribeRequest, context: Context
    ) -> pb.TranscribeResponse:
        try:
            run = self._start(request, pb.ALIGNMENT_MODE_NONE, stream=False)
            async with aclosing(run.events()) as events:
                results = [r async for r in events]  # one: the whole result, after the last event
            if len(results) != 1:
                raise RuntimeError(f"the transcription gave {len(results)} results, not 1")
            with self._engine.observer.span("xattn.response"):
                response = results[0]
                response.timings.CopyFrom(convert.timings(run.timings()))
                size, limit = response.ByteSize(), self._engine.limits.max_send_message_bytes
            if limit and size > limit:
                raise ResultTooLarge(
                    f"the result is {size} bytes, over the {limit} byte message limit: use "
                    "StreamTranscribe, float16 rows or fewer heads"
                )
            return response
        except Exception as e:
            await abort_for(context, e)
            raise

    async def StreamTranscribe(
        self, request: pb.StreamTranscribeRequest, context: Context
    ) -> AsyncIterator[pb.StreamTranscribeResponse]:
        try:
            run = self._start(request, pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS, stream=True)
            async with aclosing(run.events()) as events:
                async for response in events:
                    if response.HasField("done"):
                        with self._engine.observer.span("xattn.response"):
                            response.done.timings.CopyFrom(convert.timings(run.timings()))
                    yield response
        except Exception as e:
            await abort_for(context, e)
            raise

    async def StreamingRecognize(
        self, request_iterator: AsyncIterator[pb.StreamingRecognizeRequest], context: Context
    ) -> AsyncIterator[pb.StreamingRecognizeResponse]:
        try:
            session = LiveSession(self._engine, self._live, request_iterator)
            async with aclosing(session.responses()) as responses:
                async for response in responses:
                    yield response
        except Exception as e:
            await abort_for(context, e)
            raise

    def _start(self, request: Request, default_mode: int, stream: bool) -> Run:
        return start_transcription(
            self._engine,
            request.audio,
            request.options,
            request.alignment,
            request.model,
            default_mode,
            stream,
        )
