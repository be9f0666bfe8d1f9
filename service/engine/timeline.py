"""One transcription's events as its decode worker sees them, turned into reports and spans.

The worker times each step of the model's event generator (xattn.service.engine.engine.work)
and hands the event with its start and end here. The spans of one request's work, children of
the request's span (the face's), with their times:

    xattn.queue          queued_at .. the worker took it
    xattn.window         a window's WindowStart call .. its last token or segment
      xattn.encode       the call that yielded WindowStart: log-mel, encoder pass, cross K/V
      xattn.decode       .. the window's last token
      xattn.align        the last token .. its first segment, with word timestamps: the word
                         alignment pass (and the segments' shaping)

Batched long-form windows interleave: their spans overlap, each closed by its own events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from xattn.model.decode.results import Segment, TokenEvent, Transcript, WindowStart
from xattn.service.engine.observe import Observer, Span, decoding_of
from xattn.service.engine.run import Run


@dataclass
class _Window:
    span: Span
    decode: Span | None
    last_token: float
    last: float  # its last event


class Timeline:
    """Feed every event of one run (`event`), then `close` once when the worker is done."""

    def __init__(self, observer: Observer, run: Run) -> None:
        self.o = observer
        self.run = run
        self.model = run.pipeline.name
        self.decoding = decoding_of(run.options)
        self.started = time.perf_counter()
        self.windows: dict[int, _Window] = {}
        self.tokens = 0
        self.align = run.options.word_timestamps
        observer.begin("xattn.queue", run.queued_at).end(self.started)
        observer.queue_waited(self.model, self.started - run.queued_at)

    def event(self, event: object, t0: float, t1: float) -> None:
        o = self.o
        if isinstance(event, TokenEvent):
            if not self.tokens:
                o.first_token(self.model, self.decoding, t1 - self.run.arrived)
            self.tokens += 1
            o.token(self.model)
            w = self.windows.get(event.window)
            if w is not None:
                w.last_token = w.last = t1
        elif isinstance(event, WindowStart):
            span = o.begin("xattn.window", t0, window=event.window, offset=event.offset)
            o.begin("xattn.encode", t0, span).end(t1)
            decode = o.begin("xattn.decode", t1, span)
            self.windows[event.window] = _Window(span, decode, t1, t1)
            o.window(self.model)
        elif isinstance(event, Segment):
            w = self.windows.get(event.window)
            if w is not None:
                w.last = t1
                if w.decode is not None:
                    w.decode.end(w.last_token)
                    w.decode = None
                    if self.align:
                        o.begin("xattn.align", w.last_token, w.span).end(t1)
        elif isinstance(event, Transcript):
            for index in list(self.windows):
                self._end_window(index)

    def _end_window(self, index: int) -> None:
        w = self.windows.pop(index, None)
        if w is not None:
            if w.decode is not None:
                w.decode.end(w.last_token)
            w.span.end(w.last)

    def close(self, outcome: str, audio_seconds: float) -> None:
        """The worker is done with the run (`outcome`, its audio's length in seconds)."""
        now = time.perf_counter()
        for index in list(self.windows):
            self._end_window(index)
        if outcome == "finished":
            self.o.transcribed(self.model, audio_seconds, now - self.started)
