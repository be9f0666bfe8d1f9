"""Cached decoder steps of concurrent decodes, run together as one batched forward.

A cached step reads every decoder weight for one token, so it is bound by memory; decodes
running at once on different threads (the server's workers) can share that read. Each
decode registers while it loops (`joined`) and hands its steps to `step`, which blocks: the
model thread (below) lingers until every registered decode has a step waiting (or `linger`
seconds pass), runs them as one forward (`CacheBatch`: the linear layers over the batch,
attention per decode over its own cache) and one output projection over the batch's rows
(the batcher packs the decoder's weights for oneDNN's small-batch kernel: TextDecoder.pack),
and hands each decode its own `finish` of its row (its logit rules, the token's choice, its
attention rows), so that all of a step's torch work runs in the batch. Only the Python
around it (the token's event) stays on the decode's own thread. A step alone may skip the
projection (`project=False`): its finish then makes its logits from the state (int8).

Batches run on one thread, the model thread (one of the batcher's own, a `TurnThread`, or
the caller's: `CallerThread`), and so does the decodes' other model work (log-mel, encoder,
cross-attention K/V, the first step over the prompt, the word-timestamp pass: `call`): one
piece of torch work at a time, always from the same thread. It runs them first come, first
served; a decode that needs the thread for a while without others' work in between (a live
stream's step) takes a `turn`, and a batch goes at the turn of its earliest step
(xattn.model.decode.model_thread). Torch's OpenMP threads belong to
the thread that calls it; ops called from several threads at once each bring a team that
spins on the same cores, which cost more than the batch saved. The decodes' own threads keep
their Python work.

The batch changes no decode's numbers beyond float rounding: the same weights, each token's
own cache; tests pin token-identical transcripts.

What the model thread does can be watched (`observer`: a `BatchObserver`, e.g. the server's
metrics): each encoder call (its windows, its seconds) and each batched step (its rows, its
seconds), reported from the model thread as they end. Nothing here knows who listens.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from xattn.model.audio.features import N_FRAMES, pad_or_trim
from xattn.model.decode.model_thread import CallerThread, ModelThread, TurnThread
from xattn.model.net.kv_cache import CacheBatch, KVCache
from xattn.model.net.whisper import Whisper

T = TypeVar("T")


class ModelWork(Protocol):
    """How a decode runs a piece of model work: fn(*args) (on the model thread, or at once)."""

    def __call__(self, fn: Callable[..., T], /, *args: object) -> T: ...


def model_work(batcher: StepBatcher | None) -> ModelWork:
    """How a decode runs its model work: `batcher.call` (on the model thread), or at once."""
    return batcher.call if batcher is not None else _at_once


def model_turn(batcher: StepBatcher | None) -> contextlib.AbstractContextManager:
    """`batcher.turn()`, or nothing to wait for without a batcher."""
    return batcher.turn() if batcher is not None else contextlib.nullcontext()


def _at_once(fn: Callable[..., T], *args: object) -> T:
    return fn(*args)


def encode_window(
    model: Whisper,
    mel: Tensor,
    frames: int = N_FRAMES,
    precision: str | None = None,
    tail: int = 0,
) -> tuple[Tensor, KVCache]:
    """A window's encoder output [1, frames / 2 + tail, d] from its mel [1, n_mels, <= frames]
    (zero-padded here, on the model thread: the copy is a parallel op), and its KV cache with
    the cross-attention K/V computed (once per window). `frames` < 3000: the window's first
    frames alone (a live step over a short buffer, AudioEncoder.forward), and `tail` encoder
    frames of padding at the window's last positions. `precision`: the encoder's for this
    window (AudioEncoder.PRECISIONS; None: the model's compute)."""
    mel = pad_or_trim(mel, frames + 2 * tail)  # [1, n_mels, frames + 2 tail]
    features = model.encoder(mel, precision, tail)  # [1, frames / 2 + tail, d]
    return features, model.new_cache(features)


def encode(
    batcher: StepBatcher | None,
    model: Whisper,
    mel: Tensor,
    frames: int = N_FRAMES,
    precision: str | None = None,
    tail: int = 0,
) -> tuple[Tensor, KVCache]:
    """`encode_window`, through the batcher when there is one (StepBatcher.encode)."""
    if batcher is not None:
        return batcher.encode(mel, frames, precision, tail)
    return encode_window(model, mel, frames, precision, tail)


# a step's finish: (the state [d] before the final LayerNorm, its logits [n_vocab] when asked
# for, else None; its cross-attention scores n_layer × [1, H, 1, 1500] when asked for) -> result;
# a multi-row step's (a beam search's): [rows, d], [rows, n_vocab], n_layer × [rows, H, 1, 1500]
Finish = Callable[[Tensor, Tensor | None, list[Tensor] | None], T]


@dataclass
class _Step:
    token: int | list[int]  # a list: one per row of the cache (a multi-row step)
    cache: KVCache
    need_scores: bool
    project: bool  # needs its logits (else finish may make them from the state, alone)
    finish: Finish
    reorder: list[int] | None = None  # the cache's rows first (KVCache.reorder)
    key: int = 0  # its place on the model thread (TurnThread.key)
    turn: bool = False  # its decode runs in a turn (a live step's)
    out: object = None  # what finish returned
    error: BaseException | None = None
    done: bool = False


def _nothing() -> None:
    pass


class BatchObserver(Protocol):
    """Told, on the model thread, what each piece of its work took (wall-clock seconds)."""

    def encoded(self, windows: int, seconds: float) -> None:
        """An encoder call of `windows` windows (log-mel padding, encoder, cross K/V)."""

    def stepped(self, rows: int, seconds: float) -> None:
        """A batched decoder step of `rows` rows (a beam search's beams are rows)."""


@dataclass
class BatchStats:
    steps: int = 0  # decode steps run
    batches: int = 0  # forwards that ran them
    busy: float = 0.0  # seconds the model thread spent on work (batches and calls)
    turn_busy: float = 0.0  # ... of it on work of turns (live steps; a batch's by its rows)
    encoder_calls: int = 0  # with batch_encoder: encoder calls, and the windows they encoded
    windows_encoded: int = 0

    @property
    def mean_batch(self) -> float:
        return self.steps / self.batches if self.batches else 0.0


def _cross_position(step: _Step) -> tuple[int, int]:
    """Where a step's cross-attention K/V lie: windows of one batch (CrossKV.window) sort next
    to each other, in order, so that their attention runs as one (kv_cache.joined_rows)."""
    k = step.cache.cross.k[0]
    return k.untyped_storage().data_ptr(), k.storage_offset()


class StepBatcher:
    """Shares one batched decoder forward among the decodes of several threads."""

    def __init__(
        self,
        model: Whisper,
        max_batch: int = 16,
        linger: float = 0.003,
        thread: ModelThread | None = None,
        batch_encoder: bool | None = None,
    ) -> None:
        """`thread`: the model thread (a `CallerThread`); None: one of its own.
        `batch_encoder`: windows that wait for the encoder at once go through it as one call
        (`encode`); None: on a GPU, where a batch of windows costs little more than one (on a
        CPU the encoder is bound by compute, and a batch only adds activations that spill from
        the caches)."""
        self.model = model
        self.batch_encoder = model.device.type != "cpu" if batch_encoder is None else batch_encoder
        # windows waiting for the encoder: mel, (frames, precision), future (each encode
        # submits a call, so windows of another shape than a call's are taken by a later one)
        self._encodes: list[tuple[Tensor, tuple[int, str | None, int], Future]] = []
        model.decoder.pack()  # now, not on the first batched step: oneDNN's weight layout
        self.max_batch = max_batch
        self.linger = linger
        self.stats = BatchStats()
        self._cond = threading.Condition()
        self._pending: list[_Step] = []
        self._active = 0  # decodes registered
        self._batch_at: int | None = None  # a batch is queued at this key or before
        self._thread = thread or TurnThread()
        self.observer: BatchObserver | None = None  # told what each call and step took

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args), a decode's model work outside `step`, on the model thread; waits."""

        turn = self._in_turn()

        def run() -> T:
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    return fn(*args)
            finally:
                seconds = time.perf_counter() - t0
                self.stats.busy += seconds
                self.stats.turn_busy += seconds if turn else 0.0

        if isinstance(self._thread, CallerThread) and self._thread.owned():
            return run()
        return self._thread.submit(run).result()

    def _in_turn(self) -> bool:
        return isinstance(self._thread, TurnThread) and self._thread.in_turn()

    def round_key(self) -> int | None:
        """A key for a turn that several threads share (`turn(key)`; TurnThread.new_key);
        None without a TurnThread."""
        return self._thread.new_key() if isinstance(self._thread, TurnThread) else None

    @contextlib.contextmanager
    def turn(self, key: int | None = None) -> Iterator[None]:
        """Hold the model thread for a while: once the work queued before has run, this
        thread's model work goes before work submitted after the turn began, and the model
        thread waits for its next call (xattn.model.decode.model_thread). Entering waits for the
        turn to come, so what the caller reads next (a live stream's newest audio) is as
        fresh as it can be when its work starts. `key` (from `round_key`): a turn shared with
        other threads, whose decoder steps then batch with this one's. Without a TurnThread:
        no wait, no order."""
        if not isinstance(self._thread, TurnThread):
            yield
            return
        with self._thread.turn(key):
            self.call(_nothing)
            yield

    def encode(
        self, mel: Tensor, frames: int = N_FRAMES, precision: str | None = None, tail: int = 0
    ) -> tuple[Tensor, KVCache]:
        """`encode_window` on the model thread: a window's encoder output and its K/V cache;
        with `batch_encoder`, together with the other windows of the same shape and
        precision waiting for it then."""
        if not self.batch_encoder:
            return self.call(self._encode_one, mel, frames, precision, tail)
        future: Future[tuple[Tensor, KVCache]] = Future()
        with self._cond:
            self._encodes.append((mel, (frames, precision, tail), future))
        if isinstance(self._thread, CallerThread) and self._thread.owned():
            self._encode_waiting()  # the model thread's own window, and any waiting beside it
        else:
            self._thread.submit(self._encode_waiting)  # the first to run takes all waiting
        return future.result()

    def _encode_one(
        self, mel: Tensor, frames: int, precision: str | None, tail: int
    ) -> tuple[Tensor, KVCache]:
        """On the model thread: one window's `encode_window`, told to the observer."""
        t0 = time.perf_counter()
        out = encode_window(self.model, mel, frames, precision, tail)
        if self.observer is not None:
            self.observer.encoded(1, time.perf_counter() - t0)
        return out

    def _encode_waiting(self) -> None:
        """On the model thread: the windows waiting for the encoder, in one call."""
        with self._cond:  # the first waiting window's shape, and those of the same shape
            shape = self._encodes[0][1] if self._encodes else (N_FRAMES, None, 0)
            same = [e for e in self._encodes if e[1] == shape][: self.max_batch]
            self._encodes = [e for e in self._encodes if all(e is not x for x in same)]
        waiting = [(mel, future) for mel, _, future in same]
        if not waiting:
            return
        t0 = time.perf_counter()
        try:
            with torch.inference_mode():
                frames, precision, tail = shape
                width = frames + 2 * tail  # F
                padded = [pad_or_trim(mel, width) for mel, _ in waiting]  # [1, n_mels, F]
                mels = torch.cat(padded)  # [B, n_mels, F]
                features = self.model.encoder(mels, precision, tail)  # [B, F / 2, d]
                cross = self.model.decoder.cross_kv(features)
            n_ctx = self.model.dims.n_text_ctx
            self.stats.encoder_calls += 1
            self.stats.windows_encoded += len(waiting)
            if self.observer is not None:
                self.observer.encoded(len(waiting), time.perf_counter() - t0)
            for i, (_, future) in enumerate(waiting):
                future.set_result((features[i : i + 1], KVCache(cross.window(i), n_ctx)))
        except BaseException as e:
            for _, future in waiting:
                if not future.done():
                    future.set_exception(e)
        finally:
            self.stats.busy += time.perf_counter() - t0

    def close(self) -> None:
        """Stop the model thread once its queued work is done."""
        self._thread.shutdown(wait=True)

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """Register a decode for as long as it steps (a batch waits for registered ones)."""
        with self._cond:
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def step(
        self,
        token: int | list[int],
        cache: KVCache,
        need_scores: bool,
        project: bool,
        finish: Finish[T],
        reorder: list[int] | None = None,
    ) -> T:
        """One cached step of one decode: finish(state, logits, scores), computed on the model
        thread in a batch with the other decodes' steps. The logits are None when the step
        runs alone and not `project` (its finish makes them from the state: int8 logits).
        A list of tokens is a multi-row step (one per row of the cache, after its rows are
        reordered by `reorder`): its rows take consecutive rows of the batch."""
        mine = _Step(token, cache, need_scores, project, finish, reorder, self._thread.key())
        mine.turn = self._in_turn()
        with self._cond:
            self._pending.append(mine)
            self._schedule()
            self._cond.notify_all()
            while not mine.done:
                self._cond.wait()
        if mine.error is not None:
            raise mine.error
        return mine.out  # type: ignore[return-value]

    def _schedule(self) -> None:
        """Under the lock: a batch queued at the earliest pending step's key, or before."""
        if self._pending:
            key = min(s.key for s in self._pending)
            if self._batch_at is None or key < self._batch_at:
                self._batch_at = key
                self._thread.submit_at(key, partial(self._batch, key))

    def _batch(self, key: int) -> None:
        """On the model thread: wait for the registered decodes' steps, then run them, the
        earliest first."""
        with self._cond:
            if self._batch_at == key:
                self._batch_at = None
            deadline = time.monotonic() + self.linger
            while len(self._pending) < self._active and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            self._pending.sort(key=lambda s: s.key)
            batch = self._pending[: self.max_batch]
            self._pending = self._pending[self.max_batch :]
        try:
            if batch:  # else an earlier-keyed batch took them
                self._run(batch)
        finally:
            with self._cond:
                self._schedule()  # arrived meanwhile: at their place (when they arrived)
                self._cond.notify_all()

    def _run(self, batch: list[_Step]) -> None:
        """One forward for the batch; a step's own failure (its context full, its finish) is
        its decode's alone, the forward's is every one's."""
        decoder, t0 = self.model.decoder, time.perf_counter()
        for s in batch:
            try:
                if s.reorder is not None:
                    s.cache.reorder(s.reorder)
                s.cache.check_room(1)
            except ValueError as e:
                s.error = e
        ready = [s for s in batch if s.error is None]
        try:
            if ready:
                self._forward(decoder, ready)
        except BaseException as e:
            for s in ready:
                s.error = e
        finally:
            for s in batch:
                s.done = True
            seconds = time.perf_counter() - t0
            self.stats.steps += len(batch)
            self.stats.batches += 1
            self.stats.busy += seconds
            self.stats.turn_busy += seconds * sum(s.turn for s in batch) / len(batch)
            if self.observer is not None and ready:
                rows = sum(len(s.token) if isinstance(s.token, list) else 1 for s in ready)
                self.observer.stepped(rows, seconds)

    @staticmethod
    def _forward(decoder: torch.nn.Module, batch: list[_Step]) -> None:
        batch = sorted(batch, key=_cross_position)  # windows encoded together, in their order
        need = any(s.need_scores for s in batch)
        with torch.inference_mode():
            device = batch[0].cache.self_k.device
            ids = [t for s in batch for t in (s.token if isinstance(s.token, list) else [s.token])]
            tokens = torch.tensor(ids, device=device)[:, None]  # [B, 1]
            caches = CacheBatch([s.cache for s in batch])
            h, scores = decoder(tokens, caches, need_scores=need, hidden=True)  # [B, 1, d]
            # with others, every step takes the batch's fp32 projection, which reads the
            # weight once for all rows (oneDNN's kernel, TextDecoder.pack): 2 rows cost
            # 1.0-1.3x one row, 8 rows 1.6x, while int8 logits (a step's own finish) cost
            # one read each
            alone = len(batch) == 1 and not batch[0].project
            logits = None if alone else decoder.project(h)[:, 0]  # [B, n_vocab]
            for r, s in zip(caches.slices, batch, strict=True):
                i = r if isinstance(s.token, list) else r.start  # rows, or the one row
                row = logits[i] if logits is not None else None  # [n_vocab] or [rows, n_vocab]
                mine = [layer[r] for layer in scores] if s.need_scores else None
                try:
                    s.out = s.finish(h[i, 0], row, mine)
                except Exception as e:  # this decode's finish (its logit rules)
                    s.error = e
