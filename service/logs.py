"""The server's log lines: text for a terminal (the default), or one JSON object a line for an
aggregator (`--log-format json`): time, level, logger, message, request_id, trace_id (null
when the line belongs to no request, or no trace), and the exception's traceback when there
is one. A request's id is the face's (xattn.service.engine.observe: the caller's
X-Request-Id / x-request-id, or a new one); the trace id is the current OpenTelemetry span's,
when tracing is on (opentelemetry is not imported for it).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from xattn.service.engine.observe import current_request

FORMATS = ("text", "json")
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(ids)s"


def trace_id() -> str | None:
    """The current span's trace id, when opentelemetry is in use in this process."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    return str(trace.format_trace_id(context.trace_id)) if context.is_valid else None


class Ids(logging.Filter):
    """Adds `request_id` and `trace_id` to every record (None outside a request, a trace)
    and `ids`, their text for the text format ("" when neither is known)."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = current_request()
        record.request_id = scope.request_id if scope is not None else None
        record.trace_id = trace_id()
        parts = [f"{k}={v}" for k in ("request_id", "trace_id") if (v := getattr(record, k))]
        record.ids = f" [{' '.join(parts)}]" if parts else ""
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "trace_id": getattr(record, "trace_id", None),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup(level: str, fmt: str = "text", stream: object = None) -> logging.Handler:
    """Log to `stream` (stderr) at `level` in format `fmt` (one of FORMATS): the root's one
    handler, replacing any."""
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.addFilter(Ids())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
