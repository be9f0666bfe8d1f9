"""The Whisper encoder-decoder, written for an explicit KV cache and visible cross-attention.

Attention as in the seeds: per head d_k = d_model / n_head, scores = Q Kᵀ / sqrt(d_k), softmax
over the keys. The decoder's cross-attention keys and values come from the 1,500 encoder
frames of a window; they are computed once (`Decoder.cross_kv`) and kept in the `KVCache`.
They are stored transposed, so that a step reads them as contiguous rows. When asked, the
decoder returns the cross-attention scores of every layer and head from the same forward pass
that produced the logits: the scores are computed either way (for a few queries over 1,500
keys the explicit product is faster on a CPU than the fused SDPA kernel).

Compute (`Whisper.set_compute`): "fp32" computes as openai-whisper does; "bf16-encoder" runs
the encoder under bf16 autocast (its matmuls and convolutions, its attention as explicit
products: encoder_attention; ~2.7x faster on a CPU with AVX-512 BF16) and "int8-encoder"
its layer maps in int8 (net.quantized; fbgemm, any x86 CPU); both hand the decoder fp32
features, so the decoder and its attention rows are computed as in fp32 from them;
"int8-logits" reads the output projection of greedy steps in int8 and rescores the deciding
logits in fp32 (net.logits); "...+int8-logits" an encoder's and that.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xattn.model.net import fused
from xattn.model.net.dims import ModelDims
from xattn.model.net.kv_cache import CacheBatch, CrossKV, KVCache, joined_rows
from xattn.model.net.linear import (
    Linear,
    StepKernels,
    choose_kernels,
    column_major,
    logits,
    step_copies,
)
from xattn.model.net.logits import Int8Logits, int8_supported
from xattn.model.net.quantized import int8_blocks

# compute -> (the encoder's precision: AudioEncoder.PRECISIONS, int8 output projection for
# greedy steps)
COMPUTES = {
    "fp32": ("fp32", False),
    "bf16-encoder": ("bf16", False),
    "int8-encoder": ("int8", False),
    "int8-logits": ("fp32", True),
    "bf16-encoder+int8-logits": ("bf16", True),
    "int8-encoder+int8-logits": ("int8", True),
}


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> Tensor:
    """The encoder's fixed positional embedding."""
    log_timescale_increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]  # [length, C/2]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)  # [length, C]


def split_heads(x: Tensor, n_head: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_head, d // n_head).transpose(1, 2)  # [B, H, T, d_k]


def merge_heads(x: Tensor) -> Tensor:
    b, h, t, dk = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dk)  # [B, T, d]


class SelfAttention(nn.Module):
    """Fused Q/K/V projection; causal and cached in the decoder, full in the encoder."""

    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = Linear(n_state, 3 * n_state)  # the key part of the bias is zero
        self.out = Linear(n_state, n_state)

    def forward(
        self, x: Tensor, cache: KVCache | CacheBatch | None = None, layer: int = 0
    ) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 × [B, T, d]
        q, k, v = (split_heads(t, self.n_head) for t in (q, k, v))  # [B, H, T, d_k]
        if cache is None:  # encoder: every frame sees every frame
            return self.out(merge_heads(encoder_attention(q, k, v)))
        if isinstance(cache, CacheBatch):  # one new token per row, each over its own past
            ys = [
                F.scaled_dot_product_attention(q[r], *c.append(layer, k[r], v[r]))
                for r, c in zip(cache.slices, cache.caches, strict=True)
            ]  # caches × [rows, H, 1, d_k]
            return self.out(merge_heads(torch.cat(ys)))  # [B, 1, d]
        past = cache.length
        k, v = cache.append(layer, k, v)  # [B, H, past + T, d_k]
        t = q.shape[2]
        if t == 1:
            y = F.scaled_dot_product_attention(q, k, v)
        elif past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # new block after cached rows: row i sees everything up to past + i
            mask = torch.ones(t, past + t, dtype=torch.bool, device=x.device).tril(past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(merge_heads(y))  # [B, T, d]


QUERY_BLOCK = 256  # queries a block of the encoder's bf16 attention (its scores stay in cache)


def encoder_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Every frame over every frame: q, k, v [B, H, T, d_k] -> [B, H, T, d_k]. In fp32 (or off
    a CPU) the fused kernel; in bf16 on a CPU explicit products over blocks of QUERY_BLOCK
    queries, the scores and their softmax in bf16: the fused kernel's bf16 path runs there no
    faster than its fp32 one (tiny.en, 1,500 frames, 2 cores: 22 ms a layer against 15)."""
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v)
    q, v = q.contiguous(), v.contiguous()  # blocks of rows, read as they are
    kt = (k.transpose(-1, -2) * q.shape[-1] ** -0.5).contiguous()  # [B, H, d_k, T]
    blocks = [
        torch.matmul(q[:, :, i : i + QUERY_BLOCK], kt).softmax(dim=-1) @ v  # [B, H, <=256, d_k]
        for i in range(0, q.shape[2], QUERY_BLOCK)
    ]
    return torch.cat(blocks, dim=2)  # [B, H, T, d_k]


class CrossAttention(nn.Module):
    """Decoder queries over the window's encoder frames (K/V from the cache)."""

    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = Linear(n_state, n_state)
        self.kv = nn.Linear(n_state, 2 * n_state, bias=True)  # the key part of the bias is zero
        self.out = Linear(n_state, n_state)

    def project_kv(self, audio_features: Tensor) -> tuple[Tensor, Tensor]:
        """Keys stored transposed, kt [B, H, d_k, 1500], and values v [B, H, 1500, d_k] stored
        the same way (a view of [B, H, d_k, 1500] memory). Every token reads both whole, and
        q·Kᵀ and weights·V stream them as contiguous rows of 1,500 (on a CPU, 1.6x faster than
        frames-major memory; weights·V as the product over that view, not as Vᵀ·weightsᵀ:
        1.4x faster for one window, 2.4x for eight, with the same memory read). One product
        W·xᵀ writes both so, with no transposing copies (tiny.en: 3.8 -> 2.8 ms a layer)."""
        b, t, d = audio_features.shape
        w, bias = self.kv.weight, self.kv.bias  # [2d, d], [2d]
        x_t = audio_features.transpose(1, 2)  # [B, d, 1500]
        kv = torch.baddbmm(bias[None, :, None], w.expand(b, -1, -1), x_t)  # [B, 2d, 1500]
        kv = kv.view(b, 2, self.n_head, d // self.n_head, t)  # [B, 2, H, d_k, 1500]
        return kv[:, 0], kv[:, 1].transpose(-1, -2)  # [B, H, d_k, 1500], [B, H, 1500, d_k]

    def forward(
        self,
        x: Tensor,
        k: Tensor | list[Tensor],
        v: Tensor | list[Tensor],
        need_scores: bool,
        slices: list[slice] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """k, v: [B, H, d_k, 1500] and [B, H, 1500, d_k] (project_kv), or one pair of such
        [1, ...] per cache of a CacheBatch, whose rows of x are `slices`."""
        q = split_heads(self.query(x), self.n_head)  # [B, H, T, d_k]
        if isinstance(k, list):
            runs = joined_rows(k, v, slices or [slice(i, i + 1) for i in range(len(k))])
            pairs = [attend(q[r], kt, v, need_scores) for kt, v, r in runs]
            y = torch.cat([y for y, _ in pairs])  # [B, H, T, d_k]
            scores = joined_scores([s for _, s in pairs]) if need_scores else None
        else:
            y, scores = attend(q, k, v, need_scores)
        return self.out(merge_heads(y)), scores  # [B, T, d], [B, H, T, 1500]


def joined_scores(parts: list[Tensor]) -> Tensor:
    """Score rows [b_i, H, T, F_i] of several windows as one [B, H, T, max F]: a window of
    fewer frames (a live step's short window) is padded with -inf, which the softmax of its
    rows turns into zero weight past its frames. Windows of one width are joined as they are."""
    widest = max(p.shape[-1] for p in parts)
    if any(p.shape[-1] != widest for p in parts):
        parts = [F.pad(p, (0, widest - p.shape[-1]), value=-math.inf) for p in parts]
    return torch.cat(parts)  # [B, H, T, max F]


def attend(q: Tensor, kt: Tensor, v: Tensor, need_scores: bool) -> tuple[Tensor, Tensor | None]:
    """Cross-attention of queries q [B, H, T, d_k] over the frames, from keys stored transposed
    (kt: [B, H, d_k, 1500]) and values (v: [B, H, 1500, d_k], project_kv); with the pre-softmax
    scores when asked.
    Rows of one window (beams: q [B, H, T, d_k], kt [1, ...]) attend as B·T queries of one
    batch, so that its K/V are read once and never expanded into copies."""
    b, h, t, d_k = q.shape
    if b > 1 and kt.shape[0] == 1:
        q1 = q.transpose(0, 1).reshape(1, h, b * t, d_k)  # [1, H, B·T, d_k]
        y, scores = attend(q1, kt, v, need_scores)  # [1, H, B·T, d_k], [1, H, B·T, 1500]
        y = y.reshape(h, b, t, d_k).transpose(0, 1)  # [B, H, T, d_k]
        if scores is not None:
            scores = scores.reshape(h, b, t, -1).transpose(0, 1)  # [B, H, T, 1500]
        return y, scores
    scores = (q @ kt) / math.sqrt(q.shape[-1])  # [B, H, T, 1500]
    weights = scores.float().softmax(dim=-1).to(q.dtype)  # [B, H, T, 1500]
    y = weights @ v  # [B, H, T, d_k]
    return y, (scores if need_scores else None)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int, cross_attention: bool = False) -> None:
        super().__init__()
        self.attn_ln = nn.LayerNorm(n_state)
        self.attn = SelfAttention(n_state, n_head)
        self.cross_attn_ln = nn.LayerNorm(n_state) if cross_attention else None
        self.cross_attn = CrossAttention(n_state, n_head) if cross_attention else None
        self.mlp_ln = nn.LayerNorm(n_state)
        self.mlp = nn.Sequential(
            Linear(n_state, 4 * n_state), nn.GELU(), Linear(4 * n_state, n_state)
        )

    def forward(
        self,
        x: Tensor,
        cache: KVCache | CacheBatch | None = None,
        layer: int = 0,
        need_scores: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        x = x + self.attn(self.attn_ln(x), cache, layer)  # [B, T, d]
        scores = None
        if self.cross_attn is not None and isinstance(cache, CacheBatch):
            k = [c.cross.k[layer] for c in cache.caches]  # B × [1, H, d_k, 1500]
            v = [c.cross.v[layer] for c in cache.caches]
            y, scores = self.cross_attn(self.cross_attn_ln(x), k, v, need_scores, cache.slices)
            x = x + y  # [B, 1, d]
        elif self.cross_attn is not None and cache is not None:
            k, v = cache.cross.k[layer], cache.cross.v[layer]  # [B, H, d_k, 1500]
            y, scores = self.cross_attn(self.cross_attn_ln(x), k, v, need_scores)
            x = x + y  # [B, T, d]
        x = x + self.mlp(self.mlp_ln(x))  # [B, T, d]
        return x, scores


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList(ResidualAttentionBlock(n_state, n_head) for _ in range(n_layer))
        self.ln_post = nn.LayerNorm(n_state)

    # "fp32" as stored; "bf16": under bf16 autocast; "int8": the layer maps in int8
    PRECISIONS = ("fp32", "bf16", "int8")
    precision = "fp32"  # the default of forward (Whisper.set_compute)
    _int8: list[nn.Module] | None = None  # the blocks with int8 maps (net.quantized)

    def use(self, precision: str) -> None:
        """Make `precision` the default, preparing what it runs on (int8: the quantized maps,
        once; CPU only). Call it after loading the weights and moving the model."""
        if precision not in self.PRECISIONS:
            raise ValueError(f"unknown precision {precision!r} (one of {self.PRECISIONS})")
        if precision == "int8":
            self.int8_blocks()
        self.precision = precision

    def int8_blocks(self) -> list[nn.Module]:
        if self._int8 is None:
            if self.positional_embedding.device.type != "cpu":
                raise ValueError("the int8 encoder runs on the CPU only (fbgemm kernels)")
            self._int8 = int8_blocks(self.blocks)
        return self._int8

    def forward(self, mel: Tensor, precision: str | None = None, tail: int = 0) -> Tensor:
        """Features [B, n, d] (fp32) of mel [B, n_mels, 2n] (n <= 1500: a whole window's 3000
        frames, or fewer, whisper.cpp's audio_ctx, for live steps over a short buffer), at
        `precision` (one of PRECISIONS; default: self.precision). Frames sit at a whole
        window's positions: the first n - `tail` at its first, the last `tail` at its last
        (a short window's end, where the decoder looks when a token reads no audio); frames
        attend to n frames instead of 1500."""
        precision = precision or self.precision
        n = mel.shape[-1] // 2
        if mel.shape[-1] != 2 * n or not 0 < n <= len(self.positional_embedding):
            raise ValueError(f"mel of {mel.shape[-1]} frames: an even count up to 3000")
        if not 0 <= tail < n:
            raise ValueError(f"a tail of {tail} frames in a window of {n}")
        dtype = mel.dtype
        context = contextlib.nullcontext()
        if precision == "bf16":
            context = torch.autocast(mel.device.type, dtype=torch.bfloat16)
        blocks = self.int8_blocks() if precision == "int8" else self.blocks
        with context:
            x = F.gelu(self.conv1(mel))  # [B, d, 2n]
            x = F.gelu(self.conv2(x))  # [B, d, n]
            # contiguous: else the residual stream keeps the convolution's channel-major
            # strides, and every LayerNorm copies it (~12 ms, 3 % of a tiny.en window)
            x = x.transpose(1, 2).contiguous()  # [B, n, d]
            positions = self.positional_embedding  # [1500, d]
            if n < len(positions):  # [n, d]
                positions = torch.cat([positions[: n - tail], positions[len(positions) - tail :]])
            x = x + positions.to(x.dtype)  # [B, n, d]
            for block in blocks:
                x, _ = block(x)
            return self.ln_post(x).to(dtype)  # [B, n, d]


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        # column-major: a step's logits (split_columns) read it at memory speed, 1.3x faster
        # than the best product over the row-major layout; lookups by token id are unaffected.
        # Given as _weight, it skips the random init that the checkpoint overwrites (~0.2 s)
        self.token_embedding = nn.Embedding(
            n_vocab, n_state, _weight=column_major(n_vocab, n_state)
        )
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state))
        self.blocks = nn.ModuleList(
            ResidualAttentionBlock(n_state, n_head, cross_attention=True) for _ in range(n_layer)
        )
        self.ln = nn.LayerNorm(n_state)
        self.int8_logits: Int8Logits | None = None  # set by Whisper.set_compute
        self._blocked: Tensor | None = None  # the projection in oneDNN's layout (pack)
        self._packed_projection: Tensor | None = None  # and in packed_linear's
        self._copies = False

    def pack(self) -> None:
        """Copies of the weights that a step of several rows reads (a batched step,
        decode.step_batcher; a beam search's) in the layouts of its kernels (`step_copies`:
        +113 MB for tiny.en, ~75 ms, once); they follow no later .to()."""
        if self._copies:
            return
        maps = [m for m in self.modules() if isinstance(m, Linear)]  # cross K/V's: nn.Linear
        copies = step_copies(maps, self.token_embedding.weight)
        self._blocked, self._packed_projection = copies
        self._copies = True  # last: a thread that packs meanwhile packs the same copies

    def choose_kernels(self) -> StepKernels:
        """Time the step products on this CPU (xattn.model.net.linear.choose_kernels) and give
        every layer map the fastest for its rows."""
        maps = [m for m in self.modules() if isinstance(m, Linear)]
        kernels = choose_kernels(maps)
        for m in maps:
            m.kernels = kernels
        return kernels

    def cross_kv(self, audio_features: Tensor) -> CrossKV:
        """Cross-attention K/V of every layer, computed once per window."""
        pairs = [b.cross_attn.project_kv(audio_features) for b in self.blocks]
        return CrossKV(k=[k for k, _ in pairs], v=[v for _, v in pairs])

    def forward(
        self,
        tokens: Tensor,
        cache: KVCache | CacheBatch,
        need_scores: bool = False,
        logit_rows: Tensor | slice | None = None,
        hidden: bool = False,
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Logits for the rows `logit_rows` of the new tokens (all by default), and, when asked,
        every layer's pre-softmax cross-attention scores [B, H, T, 1500]. hidden=True returns
        those rows' states before the final LayerNorm instead of logits (for `int8_logits`)."""
        t = tokens.shape[-1]
        for c in cache.caches if isinstance(cache, CacheBatch) else [cache]:
            c.check_room(t)  # before the positions run past the embedding's
        if isinstance(cache, CacheBatch):  # [B, 1]: each decode at its own position
            positions = self.positional_embedding[cache.lengths][:, None]  # [B, 1, d]
        else:
            positions = self.positional_embedding[cache.length : cache.length + t]  # [T, d]
        x = self.token_embedding(tokens) + positions  # [B, T, d]
        done = fused.step(self, x, cache, need_scores)  # the C++ step, where it applies
        x, all_scores = done if done is not None else (x, [])
        for layer, block in enumerate(self.blocks if done is None else []):
            x, scores = block(x, cache, layer, need_scores)
            all_scores.append(scores)
        cache.advance(t)
        scores = all_scores if need_scores else None
        if logit_rows is not None:
            x = x[:, logit_rows]  # [B, T', d]
        return (x if hidden else self.project(x)), scores

    def project(self, h: Tensor) -> Tensor:
        """Logits [B, T, n_vocab] of states h [B, T, d] before the final LayerNorm
        (`xattn.model.net.linear.logits`, on a CPU over the copy `pack` made for several rows)."""
        x = self.ln(h)  # [B, T, d]
        w = self.token_embedding.weight  # [n_vocab, d], column-major
        return logits(x, w, self._blocked, self._packed_projection).float()


class Whisper(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.dims = dims
        d = dims
        self.encoder = AudioEncoder(
            d.n_mels, d.n_audio_ctx, d.n_audio_state, d.n_audio_head, d.n_audio_layer
        )
        self.decoder = TextDecoder(
            d.n_vocab, d.n_text_ctx, d.n_text_state, d.n_text_head, d.n_text_layer
        )

    @property
    def device(self) -> torch.device:
        return self.decoder.positional_embedding.device

    def set_compute(self, compute: str) -> None:
        """One of COMPUTES (see the module's docstring); call it after loading the weights."""
        if compute not in COMPUTES:
            raise ValueError(f"unknown compute {compute!r} (one of {', '.join(COMPUTES)})")
        precision, int8 = COMPUTES[compute]
        if (int8 or precision == "int8") and self.device.type != "cpu":
            raise ValueError(f"{compute} runs on the CPU only (fbgemm kernels)")
        if precision == "int8" and not int8_supported():
            raise ValueError(f"{compute} needs fbgemm's int8 kernels (an x86 CPU)")
        self.encoder.use(precision)
        d = self.decoder
        d.int8_logits = Int8Logits(d.token_embedding.weight, d.ln) if int8 else None

    def new_cache(self, audio_features: Tensor) -> KVCache:
        """A KV cache for decoding these windows: cross-attention K/V are computed here, once."""
        return KVCache(self.decoder.cross_kv(audio_features), self.dims.n_text_ctx)
