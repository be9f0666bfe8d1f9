"""The decoder's explicit key/value cache.

Two kinds of entries, per decoder layer:
- self-attention K/V grow by one row per token (preallocated up to n_text_ctx, so a
  step writes in place instead of concatenating);
- cross-attention K/V over the window's 1,500 encoder frames are computed once from the
  encoder output and reused for every token of the window, including any temperature
  fallback and the word-timestamp pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CrossKV:
    """Cross-attention keys and values of one window, per decoder layer."""

    # both with frames contiguous (xattn.model.net.whisper.CrossAttention.project_kv)
    k: list[torch.Tensor]  # n_layer × [batch, n_head, d_head, n_audio_ctx]
    v: list[torch.Tensor]  # n_layer × [batch, n_head, n_audio_ctx, d_head], a transposed view

    @property
    def batch(self) -> int:
        return self.k[0].shape[0]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def window(self, i: int) -> CrossKV:
        """Window `i` of a batch of windows: views of its rows, nothing copied (a CacheBatch
        of such windows in order attends over them as one batch: `joined_rows`)."""
        return CrossKV([k[i : i + 1] for k in self.k], [v[i : i + 1] for v in self.v])


Run = tuple[torch.Tensor, torch.Tensor, slice]  # keys, values, the batch rows they serve


def joined_rows(k: list[torch.Tensor], v: list[torch.Tensor], slices: list[slice]) -> list[Run]:
    """The cross K/V of a CacheBatch's caches for one layer (k[i], v[i]: [1 or B, H, d, F] and
    [1 or B, H, F, d] for batch rows slices[i]), with runs of one-row caches whose K/V are
    consecutive rows of one tensor (`CrossKV.window` of windows encoded together) joined into
    one view of the run: one attention over the run instead of one per window, nothing
    copied."""
    runs: list[Run] = []
    for kt, vt, r in zip(k, v, slices, strict=True):
        if runs and r.stop - r.start == 1 and _follows(runs[-1], (kt, vt, r)):
            pk, pv, pr = runs[-1]
            n = pk.shape[0] + 1
            runs[-1] = (_rows(pk, n), _rows(pv, n), slice(pr.start, r.stop))
        else:
            runs.append((kt, vt, r))
    return runs


def _follows(run: Run, nxt: Run) -> bool:
    """Whether `nxt` continues `run`: the next row of the batch and of the same tensors."""
    (pk, pv, pr), (k, v, r) = run, nxt
    if pr.stop != r.start or pr.stop - pr.start != pk.shape[0] or k.shape[0] != 1:
        return False  # not adjacent, or a run of shared K/V (a beam search's rows)
    return all(
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.stride() == b.stride()
        and b.storage_offset() == a.storage_offset() + a.shape[0] * a.stride(0)
        for a, b in ((pk, k), (pv, v))
    )


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first `n` rows of the tensor `t` is a view into (`t` being its first rows)."""
    return t.as_strided((n, *t.shape[1:]), t.stride(), t.storage_offset())


class KVCache:
    """Self-attention K/V for one decode, plus the window's cross-attention K/V."""

    def __init__(self, cross: CrossKV, n_ctx: int, rows: int | None = None) -> None:
        """`rows`: decodes of this window stepped together (beams, samples), all over its one
        cross-attention K/V (batch 1); None: one per window of `cross`."""
        k0 = cross.k[0]
        batch, n_head, d_head, _ = k0.shape
        batch = rows or batch
        n_layer = len(cross.k)
        shape = (n_layer, batch, n_head, n_ctx, d_head)
        self.cross = cross
        like = dict(dtype=k0.dtype, device=k0.device)
        # uninitialised: rows past `length` are never read (zeroing them cost ~1 ms a cache)
        self.self_k = torch.empty(shape, **like)  # [L, B, H, n_ctx, d_head]
        self.self_v = torch.empty(shape, **like)  # [L, B, H, n_ctx, d_head]
        self.length = 0  # rows of self-attention K/V filled so far
        self.n_ctx = n_ctx

    @property
    def rows(self) -> int:
        return self.self_k.shape[1]

    def fork(self) -> KVCache:
        """A fresh self-attention cache that shares this window's cross-attention K/V."""
        return KVCache(self.cross, self.n_ctx)

    def append(
        self, layer: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new rows of `layer` and return all rows so far (views, no copy)."""
        t = k.shape[2]  # new tokens
        self.check_room(t)
        end = self.length + t
        self.self_k[layer, :, :, self.length : end] = k  # [B, H, t, d_head]
        self.self_v[layer, :, :, self.length : end] = v  # [B, H, t, d_head]
        return self.self_k[layer, :, :, :end], self.self_v[layer, :, :, :end]

    def check_room(self, t: int) -> None:
        """Raise ValueError (the decoder's context is full) unless `t` more rows fit."""
        if self.length + t > self.n_ctx:
            raise ValueError(f"decoder context full: {self.length + t} > {self.n_ctx} positions")

    def advance(self, n: int) -> None:
        """Commit `n` rows after every layer has appended them."""
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget rows past `length` (e.g. to restart a window's decode)."""
        self.length = min(self.length, length)

    def reorder(self, indices: list[int]) -> None:
        """Row i of the self-attention K/V becomes row indices[i] (a beam search's step: each
        new beam continues its source's past; rows may repeat, drop, or grow from one). The
        cross-attention K/V are shared by every row and stay untouched."""
        if indices == list(range(self.rows)):
            return
        idx = torch.tensor(indices, device=self.self_k.device)
        n = self.length
        k = self.self_k[:, :, :, :n].index_select(1, idx)  # [L, B', H, n, d_head]
        v = self.self_v[:, :, :, :n].index_select(1, idx)  # [L, B', H, n, d_head]
        if len(indices) != self.rows:
            shape = (*k.shape[:3], self.n_ctx, k.shape[-1])
            self.self_k, self.self_v = k.new_empty(shape), v.new_empty(shape)
        self.self_k[:, :, :, :n] = k
        self.self_v[:, :, :, :n] = v


class CacheBatch:
    """The caches of several decodes stepped together, one new token per row
    (decode.step_batcher): the decoder runs its linear layers once over the batch and each
    one's attention over its own cache, since their lengths and their windows differ. A cache
    may hold several rows (a beam search's beams): consecutive rows of the batch (`slices`)."""

    def __init__(self, caches: list[KVCache]) -> None:
        self.caches = caches
        ends = [0]
        for c in caches:
            ends.append(ends[-1] + c.rows)
        self.slices = [slice(a, b) for a, b in zip(ends, ends[1:], strict=False)]

    @property
    def lengths(self) -> list[int]:
        """Each row's position."""
        return [c.length for c in self.caches for _ in range(c.rows)]

    def advance(self, n: int) -> None:
        for c in self.caches:
            c.advance(n)
