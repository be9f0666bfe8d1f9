"""Encoded audio decoded in processes of their own, so that a native crash is one request's.

A file's bytes go through FFmpeg (PyAV) or libsndfile, C libraries that a malformed input can
crash: a segmentation fault there would end the server and every request in it (CI's fuzzer
found one, xattn.model.audio.DEMUXERS). Here each decode runs in a worker process: the worker
that dies takes only the request it was decoding, which gets an AudioError that says so, and
a new worker replaces it. A decode that runs past `timeout` is killed the same way.

A worker is `python -m xattn.service.engine.decoders FD`, a fresh interpreter (nothing forked from a
server with gRPC and torch threads) that serves decodes over the socket FD until it dies or
the pool closes. It runs xattn.model.audio.containers.decode_native (no torch: ~70 MB, started in
~0.1 s) and returns mono samples at the file's own rate; the server resamples them
(xattn.model.audio.features.to_16k), so the samples are decode_audio's. A dead worker is replaced at
once, before the next request needs it. Raw PCM never comes here (numpy alone reads it).
"""

from __future__ import annotations

import io
import logging
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection

import numpy as np
import soundfile

from xattn.model.audio.containers import AudioError, AudioTooLongError, decode_native

log = logging.getLogger(__name__)

STARTUP = 60.0  # seconds a new worker may take to start, beside its first decode's timeout
_ERRORS = {"AudioError": AudioError, "AudioTooLongError": AudioTooLongError}


def _silence() -> bytes:
    """10 ms of silence as a WAV file."""
    out = io.BytesIO()
    soundfile.write(out, np.zeros(160, np.float32), 16000, format="WAV")
    return out.getvalue()


_SILENCE = _silence()


def _serve(conn: Connection) -> None:
    """A worker: decode what comes until None (or the pipe closes)."""
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        data, max_seconds = job
        try:
            reply = ("audio", decode_native(data, max_seconds=max_seconds))
        except AudioError as e:
            reply = ("error", type(e).__name__, str(e))
        except Exception as e:  # a bug, not the input's fault: the server reports INTERNAL
            reply = ("bug", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except OSError:  # the server is gone
            return


class _Worker:
    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        command = [sys.executable, "-m", "xattn.service.engine.decoders", str(fd)]
        self.process = subprocess.Popen(
            command, pass_fds=(fd,), stdin=subprocess.DEVNULL, start_new_session=True
        )  # its own session: a terminal's ^C is the server's to handle
        theirs.close()  # ours alone: its death reads as EOF here
        self.conn = Connection(ours.detach())
        self.new = True  # until its first reply: its start-up is not its decode's time

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.conn.close()


class DecoderProcesses:
    """At most `processes` decodes at once, each in a worker process (blocking calls: run
    `decode` on a thread)."""

    def __init__(self, processes: int = 2, timeout: float = 300.0) -> None:
        self.timeout = timeout
        self.crashes = 0  # workers that died while decoding
        self._slots = threading.BoundedSemaphore(processes)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[int] = set()  # workers that have a decode's input (process ids)
        self._closed = False

    def start(self) -> None:
        """Have a worker ready: one has decoded a short silence, so that the next request does
        not wait for one to start. Closed, nothing."""
        try:
            self.decode(_SILENCE)
        except RuntimeError:
            if not self._closed:
                raise

    def pids(self) -> list[int]:
        """The idle workers' process ids."""
        with self._lock:
            return [w.process.pid for w in self._idle]

    def busy(self) -> list[int]:
        """The process ids of the workers that have a decode's input (sent to them whole,
        their reply not yet read): a worker that dies now fails that decode."""
        with self._lock:
            return sorted(self._busy)

    def decode(self, data: bytes, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
        """xattn.model.audio.containers.decode_native(data, max_seconds=...) in a worker: mono
        samples at the file's rate, and the rate."""
        with self._slots:
            worker = self._take()
            try:
                worker.conn.send((data, max_seconds))
            except OSError:  # it died before it had the input: not the input's doing
                worker.stop(kill=True)
                worker = self._take()
                worker.conn.send((data, max_seconds))
            pid = worker.process.pid
            with self._lock:
                self._busy.add(pid)
            try:
                if not worker.conn.poll(self.timeout + STARTUP * worker.new):
                    self._lost(worker)
                    raise AudioError(
                        f"cannot decode audio: decoding took longer than {self.timeout:g} s; "
                        "convert it to WAV or FLAC, or send PCM"
                    )
                try:
                    reply = worker.conn.recv()
                except (EOFError, OSError):
                    raise self._crashed(worker, len(data)) from None
            finally:
                with self._lock:
                    self._busy.discard(pid)
            worker.new = False
            self._give_back(worker)
        if reply[0] == "audio":
            return reply[1]
        if reply[0] == "error":
            raise _ERRORS.get(reply[1], AudioError)(reply[2])
        raise RuntimeError(f"the audio decoder failed: {reply[1]}")

    def close(self) -> None:
        """Stop the idle workers (a decode in progress stops its own when it ends)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.stop()

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise RuntimeError("the audio decoders are closed")
            while self._idle:
                worker = self._idle.pop()
                if worker.alive():
                    return worker
                worker.stop(kill=True)
        return _Worker()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(worker)
                return
        worker.stop()

    def _crashed(self, worker: _Worker, size: int) -> AudioError:
        try:
            code = worker.process.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        self._lost(worker)
        with self._lock:
            self.crashes += 1
        how = f"exit code {code}"
        if code is not None and code < 0:
            how = signal.Signals(-code).name
        log.warning("the audio decoder died (%s) on a %d-byte input; a new one starts", how, size)
        return AudioError(
            f"cannot decode audio: the decoder crashed on this input ({how}); it is damaged or "
            "not an audio format xattn reads: convert it to WAV or FLAC, or send PCM"
        )

    def _lost(self, worker: _Worker) -> None:
        """Kill a worker that crashed or hung; a new one starts in its place."""
        worker.stop(kill=True)
        threading.Thread(target=self._replace, daemon=True).start()

    def _replace(self) -> None:
        """A new idle worker in place of one that died."""
        try:
            self.start()
        except Exception:  # the next decode starts one instead
            log.exception("a new audio decoder did not start")


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
