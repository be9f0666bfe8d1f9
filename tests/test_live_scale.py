"""benchmarks.live_scale end to end (--quick: levels 1 and 2, short audio, a real server and
both doors, the peer skipped), its word matching and its peer's reading of WhisperLiveKit's
lines. No timing asserts: the figures must be there and sane."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.live_match import matched_delays, matched_pairs, words_of
from benchmarks.live_peer import Committed
from benchmarks.live_scale import eval_clips, sequences
from benchmarks.wer import EVAL

needs_eval = pytest.mark.skipif(
    not (EVAL / "manifest.jsonl").is_file(), reason=f"needs the shared eval clips: {EVAL}"
)
WER = re.compile(r"^\d+\.\d % \((\d+)/(\d+)/(\d+) of (\d+)\)$")


def test_text_only_words_match_in_order_and_never_before_they_were_heard() -> None:
    """Words without times (Realtime deltas) pair by text in order; a word cannot pair with a
    reference word that ended more than 1 s after it arrived; an inserted word skips nothing."""
    ref = [("the", 1.0), ("cat", 1.5), ("sat", 2.0), ("on", 2.4), ("the", 2.8), ("mat", 3.2)]
    live = [(w, None, t) for w, t in [("the", 2.0), ("a", 2.0), ("cat", 2.0), ("sat", 2.6)]]
    live += [(w, None, t) for w, t in [("on", 3.5), ("the", 3.5), ("mat", 4.0)]]
    assert matched_pairs(ref, live) == [(0, 0), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    assert matched_delays(ref, live) == pytest.approx([1.0, 0.5, 0.6, 1.1, 0.7, 0.8])
    early = [("mat", None, 1.0)]  # "mat" ends at 3.2: not heard by 1.0 (+1 s)
    assert matched_pairs(ref, early) == []


def test_timed_words_pair_with_their_own_repetition() -> None:
    said = [("ask", 1.0), ("not", 1.5)]
    ref = said + [(w, end + 10.0) for w, end in said]
    live = [("ask", 11.1, 11.5), ("not", 11.4, 12.0)]
    assert matched_pairs(ref, live) == [(2, 0), (3, 1)]


def test_peer_lines_commit_words_once_and_count_revisions() -> None:
    done = Committed()
    done.update([{"text": "Hello there,"}], 1.0)
    done.update([{"text": "Hello there, general"}, {"text": ""}], 2.0)
    assert [w[0] for w in done.words] == ["hello", "there", "general"]
    assert [w[2] for w in done.words] == [1.0, 1.0, 2.0]
    done.update([{"text": "Hello there, generous Kenobi"}], 3.0)
    assert done.revised == 1 and [w[2] for w in done.words] == [1.0, 1.0, 3.0, 3.0]
    assert words_of("It's -- fine.") == ["it's", "fine"]


@needs_eval
def test_streams_feed_their_own_sequences() -> None:
    found = eval_clips("tiny.en")
    assert found and all(c.language == "en" for c in found)
    groups = sequences(found, 2 * len(found), 60.0)
    feeds = [tuple(c.file for c in g) for g in groups]
    assert len(set(feeds)) == len(feeds)  # no two streams feed the same sequence
    assert all(c.language != "en" for c in eval_clips("base"))


# the server's live capacity given, not measured: the quick levels (1 and 2) are served
QUICK = ["--quick", "--skip", "peer", "--max-live-streams", "2"]


@needs_eval
def test_quick_run_end_to_end(tmp_path: Path) -> None:
    from benchmarks import live_scale, render, results

    out = tmp_path / "live_scale.json"
    assert live_scale.main([*QUICK, "--json", str(out)]) == 0
    run = results.load(out)
    rows = run.figures["live streams at real time"]
    assert [(r["door"], r["streams"]) for r in rows] == [
        ("gRPC", 1),
        ("gRPC", 2),
        ("Realtime", 1),
        ("Realtime", 2),
    ]
    for r in rows:
        matched, words = (int(x) for x in r["matched words"].split("/"))
        assert 0 < matched <= words, r
        assert r["lag median s"] is not None and r["lag median s"] >= 0, r
        assert r["lag p90 s"] >= r["lag median s"], r
        for cell in (r["WER live (S/D/I of words)"], r["WER offline default"]):
            s, d, i, n = (int(x) for x in WER.match(cell).groups())  # type: ignore[union-attr]
            assert n > 0 and s + d <= n, cell
        assert r["refusals"] == 0 and r["not served"] == 0, r
        assert 0 <= r["never committed"] <= words, r
        assert r["compute s per audio s"] > 0 and r["peak RSS MB"] > 0, r
        assert r["encoder passes"] > 0 and r["encoder floor s per audio s"] > 0, r
    waits = run.figures["where the lag goes: the longest waits"]
    assert len(waits) == len(rows)
    assert run.settings["peer"] == "skipped (--skip peer)"
    files = {"live_scale": out}
    table = render.live_summary(files)
    assert "| gRPC | 2 |" in table and "| Realtime | 1 |" in table
    json.dumps(run.figures)  # plain JSON all through
