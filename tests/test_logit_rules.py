"""The per-step logit rules' fast paths (decode/decoding.py, top_k of net/logits.py): one row
as rows, ties as torch, the k largest as topk."""

from __future__ import annotations

import math

import pytest
import torch

from xattn.model.decode.decoding import LogitRules, first_max
from xattn.model.net.logits import BLOCK, top_k

TS = 50  # timestamp_begin of a toy vocabulary of 80


def _rules() -> LogitRules:
    none = torch.tensor([], dtype=torch.long)
    return LogitRules(1, none, none, 49, TS, 48, None)


def _reference(logits: torch.Tensor) -> torch.Tensor:
    """openai-whisper's ApplyTimestampRules tail, for one row: timestamps win when their total
    probability beats every text token's; then the log-probabilities of what is left."""
    logits = logits.clone()
    logprobs = torch.log_softmax(logits, dim=-1)
    if logprobs[TS:].logsumexp(dim=-1) > logprobs[:TS].max():
        logits[:TS] = -math.inf
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("seed", range(6))
def test_one_row_as_the_reference_and_as_rows(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(4, 80, generator=g) * 3
    rows[seed % 4, TS:] += 4  # a row where timestamps win
    want = torch.stack([_reference(r) for r in rows])
    as_rows = rows.clone()
    assert torch.equal(_rules().prefer_timestamps(as_rows), want)
    for r in range(4):
        one = rows[r].clone()
        assert torch.equal(_rules().prefer_timestamps(one), want[r])
        assert torch.equal(one, as_rows[r])  # the logits left as the rows path leaves them


def test_rows_masked_as_each_row_alone() -> None:
    rules = LogitRules(1, torch.tensor([3, 7, 20]), torch.tensor([0, 49]), 49, TS, 48, 5)
    text = set(range(TS)) - {3, 7, 20, 48}  # never: the suppressed and <|notimestamps|>
    allowed = {  # each history's allowed ids, by whisper's rules (sample_begin 1)
        (1,): set(range(TS, TS + 6)),  # first: a timestamp, at most the 5th
        (1, TS + 2, 4): text | set(range(TS + 3, 80)),  # monotone: after TS + 2
        (1, TS + 2, 4, TS + 6): {49} | set(range(TS + 6, 80)),  # close the pair, or end
        (1, TS + 2, 4, TS + 6, TS + 6): text,  # a pair closed: text
        (1, 5, 6): text | set(range(TS, 80)),
    }
    for first in (True, False):  # a beam's rows are all at one length
        rows = [list(h) for h in allowed if (len(h) == 1) == first]
        logits = torch.randn(len(rows), 80)
        one_by_one = logits.clone()
        rules.mask_rows(logits, rows)
        for row, alone, tokens in zip(logits, one_by_one, rows, strict=True):
            rules.mask(alone, tokens)
            assert set(row.isfinite().nonzero()[:, 0].tolist()) == allowed[tuple(tokens)]
            assert torch.equal(row, alone)


def test_first_max_as_torch_argmax() -> None:
    cases = [
        torch.tensor([0.0, 3.0, 3.0, -1.0]),  # a tie: the first
        torch.tensor([-math.inf, -math.inf, 2.0]),
        torch.tensor([1.0, float("nan"), 5.0]),  # NaN is the largest, as in torch
        torch.randn(51864),
    ]
    for x in cases:
        assert first_max(x) == int(torch.argmax(x))


@pytest.mark.parametrize("k", [1, 6, 32])
@pytest.mark.parametrize("n", [51864, 51865, 50257, 40 * BLOCK])
def test_top_k_as_topk(n: int, k: int) -> None:
    g = torch.Generator().manual_seed(n + k)
    x = torch.log_softmax(torch.randn(5, n, generator=g) * 4, dim=-1)  # [5, n]
    x[0, -3:] += 40  # the largest in the last, partial block
    x[1, :k] += 40  # in the first block
    x[2, BLOCK - 2 : BLOCK + 2] += 40  # across two blocks
    x[3, 7::BLOCK] += 40  # one in every block
    x[4, 100:] = -math.inf  # the largest all in the first 100 (2 blocks)
    for rows in (x, x[2]):  # rows [5, n] and one row [n]
        values, ids = top_k(rows, k)
        want_values, want_ids = rows.topk(k)
        assert torch.equal(values, want_values) and torch.equal(ids, want_ids)


def test_top_k_with_too_few_finite_values() -> None:
    x = torch.full((2, 70 * BLOCK), -math.inf)
    x[0, [5, 900, 4000]] = torch.tensor([1.0, 3.0, 2.0])
    x[1, 17] = 0.5
    values, ids = top_k(x, 6)
    assert torch.equal(values, x.topk(6).values)
    assert ids[0, :3].tolist() == [900, 4000, 5] and ids[1, 0] == 17
