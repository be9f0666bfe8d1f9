"""The decoder's output projection in int8, with the deciding logits rescored exactly in fp32.

A cached greedy step reads the whole tied output projection (n_vocab × d: 80 MB of fp32 for
tiny.en, most of a step's memory traffic) to pick one token. `Int8Logits` reads it as int8
instead (fbgemm's dynamic-quantized linear: per-row weight scales, the activations quantized
per step) and then recomputes in fp32, from the same hidden state and weights as the exact
path, every logit that can decide the step:

- the text tokens whose int8 logit lies within K·σ of the best one's (σ: a bound on the
  standard deviation of the int8 error, per token, from the rounding steps of both
  operands; K = 8, while the largest error seen over tiny.en and base on the test clips is
  5.5 of the exact σ). They are nearly always among the 32 largest int8 logits, which are
  rescored anyway: only when a token outside those could come within K·σ (its int8 logit
  is at most the 32nd's, its error at most the largest K·σ) does the search go over every
  token (0-10 % of the steps on the test clips: tiny.en 0 and 2, base 1 and 13 of 26-134);
- all 1,501 timestamp tokens (the timestamp rule compares their total probability with the
  best text token).

Tokens masked before the rescoring stay -inf. So the greedy choice and the timestamp rule
see exact fp32 logits, and the transcript, the attention rows and the word times are those
of the fp32 path. Only a step's log-probability differs: its softmax normaliser sums, beside
the exact logits (the deciding ones and the 32 largest), int8 values shifted by the int8
error's mean over the rescored tokens (the activations' rounding error is partly common to
every token). On the test clips that puts each token's log-probability within 0.02
(tiny.en) and 0.07 (base) of fp32's.

The final LayerNorm's scale is folded into the weights (x = γ⊙n + β gives logits
(W⊙γ)·n + W·β), so the quantized activations are the normalised n, without the few
dimensions that γ makes large: that halves the error, and keeps the candidates few (median
1, at most ~1,000 on the test clips).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SIGMAS = 8.0  # candidates: within this many standard deviations of the int8 error
MASS_TOKENS = 32  # rescored too, so that a step's log-probability is close to fp32's
ACTIVATION_LEVELS = 127  # reduce_range: 7-bit activations (fbgemm's int16 sums cannot saturate)


def int8_supported() -> bool:
    """Whether this build of torch has fbgemm's int8 kernels (x86 CPUs)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


BLOCK = 64  # top_k's blocks of tokens


def top_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values of each row of x [..., n] and their ids, as x.topk(k) (equal values'
    ids possibly in another order): from the k blocks of BLOCK values with the largest maxima
    (they hold the k largest values), 3-5x faster over a vocabulary on a CPU; x.topk(k)
    itself where a row has fewer than k finite values."""
    *lead, n = x.shape
    whole = n // BLOCK
    if whole < k or not x.is_cpu:
        return x.topk(k)
    rows = x.reshape(-1, n)  # [R, n]
    maxima = rows[:, : whole * BLOCK].view(len(rows), whole, BLOCK).amax(dim=-1)  # [R, whole]
    if whole * BLOCK < n:
        tail = rows[:, whole * BLOCK :].amax(dim=-1, keepdim=True)  # [R, 1]
        maxima = torch.cat([maxima, tail], dim=1)  # [R, blocks]
    blocks = maxima.topk(k).indices.sort(dim=-1).values  # [R, k] in the order of the ids
    ids = (blocks[:, :, None] * BLOCK + torch.arange(BLOCK)).view(len(rows), -1)  # [R, k·BLOCK]
    beyond = ids >= n  # the last block's ids past the row
    values = rows.gather(1, ids.clamp(max=n - 1)).masked_fill_(beyond, -math.inf)
    top, where = values.topk(k)  # [R, k]
    if not bool(top[:, -1].isfinite().all()):
        return x.topk(k)
    return top.view(*lead, k), ids.gather(1, where).view(*lead, k)


class Int8Logits:
    """Logits of one hidden state for greedy decoding; see the module docstring."""

    def __init__(self, embedding: Tensor, ln: nn.LayerNorm) -> None:
        w = embedding.detach().float()  # [V, d], the model's own (column-major) tensor
        gamma, beta = ln.weight.detach().float(), ln.bias.detach().float()  # [d]
        folded = torch.mul(w, gamma, out=w.new_empty(w.shape))  # [V, d] row-major, one pass
        scale = folded.abs().amax(dim=1).clamp_min(1e-12) / 127  # [V]
        with warnings.catch_warnings():  # the quantized-tensor constructors warn of deprecation
            warnings.simplefilter("ignore")
            zero = torch.zeros_like(scale, dtype=torch.long)
            q = torch.quantize_per_channel(folded, scale.double(), zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(q, None)
        self.weight_t = w.T  # [d, V] shared with the model: candidates are few columns
        self.bias = w @ beta  # [V] the folded LayerNorm shift, exact
        # σ of the error ≤ (step·|w_j| + |n|·s_j) / √12, from the activations' rounding step and
        # the weights' s_j (uniform rounding: variance step² / 12); SIGMAS of it, per token
        self.w_norm = folded.norm(dim=1) * (SIGMAS / math.sqrt(12))  # [V]
        self.w_step = q.q_per_channel_scales().float() * (SIGMAS / math.sqrt(12))  # [V]
        self.max_w_norm, self.max_w_step = float(self.w_norm.max()), float(self.w_step.max())
        self.eps = ln.eps
        self.gamma, self.beta = gamma, beta

    def approximate(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """int8 logits [V] of the pre-LayerNorm hidden state h [d], and SIGMAS times a bound on
        their error's σ [V]: the margin within which the exact logit lies."""
        approx, n_norm, step = self._int8(h)
        return approx, self._margin(n_norm, step)

    def _int8(self, h: Tensor) -> tuple[Tensor, float, float]:
        """int8 logits [V] of h [d], and what their margins follow from: the normalised
        state's norm and the activations' rounding step."""
        d = h.shape[-1]
        n = F.layer_norm(h, (d,), eps=self.eps)  # [d] normalised, before γ and β
        approx = torch.ops.quantized.linear_dynamic(n[None], self._packed, True)[0]  # [V]
        approx += self.bias
        lo, hi = min(float(n.min()), 0.0), max(float(n.max()), 0.0)
        return approx, float(n.norm()), (hi - lo) / ACTIVATION_LEVELS

    def _margin(self, n_norm: float, step: float, ids: Tensor | None = None) -> Tensor:
        """SIGMAS × σ of the int8 error [V], or of the tokens `ids` [k] only."""
        if ids is None:
            return (self.w_step * n_norm).add_(self.w_norm, alpha=step)  # [V]
        return (self.w_step[ids] * n_norm).add_(self.w_norm[ids], alpha=step)  # [k]

    def exact(self, x: Tensor, ids: Tensor | slice) -> Tensor:
        """fp32 logits of the tokens `ids` from x [d], the state after the final LayerNorm, as
        the exact path computes them."""
        if isinstance(ids, slice):
            return x @ self.weight_t[:, ids]  # [k]
        # index_select gathers the columns in parallel: 1.8x faster than weight_t[:, ids]
        return x @ self.weight_t.index_select(1, ids)  # [k]

    def logits(self, h: Tensor, mask: Callable[[Tensor], None], timestamp_begin: int) -> Tensor:
        """Logits [V] for a greedy step from h [d]: `mask(logits)` sets the forbidden ones to
        -inf in place (they stay so); then every logit that can be the best text token (ids
        below `timestamp_begin`), and every allowed timestamp, is exact."""
        approx, n_norm, step = self._int8(h)
        mask(approx)
        x = F.layer_norm(h, (h.shape[-1],), self.gamma, self.beta, self.eps)  # [d]
        ts = timestamp_begin
        text = approx[:ts]  # [ts]
        top, ids = top_k(text, min(MASS_TOKENS, ts))  # [K] most of the softmax's mass, sorted
        if math.isfinite(float(top[0])):
            every = not math.isfinite(float(top[-1]))  # the K hold every allowed token
            self._rescore(x, text, ids[top.isfinite()] if every else ids, n_norm, step, every)
        stamps = approx[ts:]  # [1501]
        allowed = stamps.isfinite()
        if bool(allowed.any()):
            approx[ts:] = torch.where(allowed, self.exact(x, slice(ts, None)), -math.inf)
        return approx

    def _rescore(
        self, x: Tensor, text: Tensor, ids: Tensor, n_norm: float, step: float, every: bool
    ) -> None:
        """Write into `text` [ts] the exact logits, from x [d] after the final LayerNorm, of
        `ids` [k] (the K largest allowed int8 logits, sorted; `every`: all the allowed ones)
        and of every other token that can be the best; shift the rest by the int8 error's
        mean over the rescored ones, and keep them below the best one's exact logit."""
        guess = text[ids]  # [k] sorted, finite
        best_low = float((guess - self._margin(n_norm, step, ids)).max())  # the best is above
        # a token outside the K has an int8 logit ≤ guess[-1], its error ≤ the largest margin
        rest_high = float(guess[-1]) + self.max_w_step * n_norm + self.max_w_norm * step
        if not every and rest_high >= best_low:  # rare: the full search, over every token
            margin = self._margin(n_norm, step)[: len(text)]  # [ts]
            best_low = float((text - margin).max())
            deciding = (text + margin) >= best_low  # [ts] the others are below best_low
            ids = torch.cat([deciding.nonzero()[:, 0], ids]).unique()  # [k']
            guess = text[ids]  # [k']
        exact = self.exact(x, ids)  # [k]
        # the int8 error is partly common to all tokens (the activations' rounding)
        text.add_(float((exact - guess).mean())).clamp_(max=best_low - 1e-3)
        text[ids] = exact
