"""benchmarks.live_scale's figures from its raw runs: per door and level, commit lag, the
finals' word errors against the references beside the offline default's on the same clips,
words never committed, refusals, compute, the encoder floor and memory.

A raw level is benchmarks.live_scale_clients' JSON (or benchmarks.live_peer's, the same shape)
plus what the benchmark measured around it on the server: "cpu s" (the server process's CPU
seconds during the level), "peak RSS MB", "encoder passes", "encoder frames" and "encoder s"
(the server's encoder calls, counted by a forward hook; frames: mel frames in, 3,000 a 30 s
window). `Stream`s describe each stream's audio: its clips, their references and offline texts.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.grpc_load import percentile
from benchmarks.live_match import LiveWord, RefWord, matched_pairs
from benchmarks.wer import counts

Row = dict[str, Any]
WINDOW_FRAMES = 3000  # mel frames of a 30 s window
CLIP_END = 1.5  # seconds: a word ending this close to its clip's end is a clip's last words


@dataclass(frozen=True)
class Stream:
    """One stream's audio and what it is judged against."""

    clips: tuple[str, ...]  # clip file names, in order
    ends: tuple[float, ...]  # each clip's end on the stream's clock (s)
    seconds: float  # the whole feed
    reference: str  # the manifest texts, joined
    offline: str  # the offline default's texts of each clip (a Transcribe each), joined
    words: tuple[RefWord, ...]  # the offline transcript of the whole feed: DTW words
    language: str


def live_words(raw: Sequence[Sequence[Any]]) -> list[LiveWord]:
    return [(str(w), None if e is None else float(e), float(a)) for w, e, a in raw]


def wer_cell(s: int, d: int, i: int, n: int) -> str:
    return f"{100 * (s + d + i) / max(n, 1):.1f} % ({s}/{d}/{i} of {n})"


def level_row(
    door: str, raw: dict[str, Any], streams: Sequence[Stream], encoder: float | None
) -> Row:
    """One door and level's row; `encoder`: a 30 s window's encoder pass (s), measured in a
    process of its own (None: not measured)."""
    runs = raw["streams"]
    n = len(runs)
    delays: list[float] = []
    tail: list[float] = []  # the lag of a clip's last words
    ours, theirs, never = [0, 0, 0, 0], [0, 0, 0, 0], 0
    matched = offline_words = 0
    for run, stream in zip(runs, streams, strict=False):
        live = live_words(run["words"])
        for i, j in matched_pairs(stream.words, live):
            lag = live[j][2] - stream.words[i][1]
            delays.append(lag)
            end = stream.words[i][1]
            if any(0 <= c - end <= CLIP_END for c in stream.ends):
                tail.append(lag)
        matched += sum(1 for _ in matched_pairs(stream.words, live))
        offline_words += len(stream.words)
        text = run["text"] or " ".join(w for w, _, _ in live)
        for total, hyp in ((ours, text), (theirs, stream.offline)):
            for k, v in enumerate(counts(stream.reference, hyp, stream.language)):
                total[k] += v
        offline_text = " ".join(w for w, _ in stream.words)
        never += counts(offline_text, text, stream.language)[1]  # deletions: never final
    audio = sum(r["audio s"] for r in runs)
    row: Row = {
        "door": door,
        "streams": n,
        "audio s each": round(statistics.mean(r["audio s"] for r in runs), 1),
        "lag median s": round(statistics.median(delays), 2) if delays else None,
        "lag p90 s": round(percentile(delays, 90), 2) if delays else None,
        "lag max s": round(max(delays), 2) if delays else None,
        "lag median, clips' last words s": round(statistics.median(tail), 2) if tail else None,
        "matched words": f"{matched}/{offline_words}",
        "WER live (S/D/I of words)": wer_cell(*ours),
        "WER offline default": wer_cell(*theirs),
        "WER live - offline pp": round(100 * (sum(ours[:3]) - sum(theirs[:3])) / ours[3], 1)
        if ours[3]
        else None,
        "never committed": never,
        "refusals": sum(r["refusals"] for r in runs),
        "retry hints ms": sorted({h for r in runs for h in r["retry hints ms"]}) or None,
        "not served": sum(1 for r in runs if r["error"]),
        "errors": sorted({r["error"] for r in runs if r["error"]})[:2] or None,
    }
    steps = [r["steps"] for r in runs if r.get("steps") is not None]
    row["live steps per stream"] = round(statistics.mean(steps), 1) if steps else None
    cpu = raw.get("cpu s")
    row["compute s per audio s"] = round(cpu / audio, 3) if cpu is not None and audio else None
    row |= floor_cells(raw, encoder, audio, n)
    peak = raw.get("peak RSS MB")
    row["peak RSS MB"] = round(peak) if peak is not None else None
    return row


def floor_cells(raw: dict[str, Any], encoder: float | None, audio: float, n: int) -> Row:
    """The encoder floor: the passes the server ran, each at the side process's time for its
    frames (linear in frames: a 30 s window's pass x frames / 3,000), over the audio; and one
    round of the streams' steps at a 30 s window each (a lower bound on a step's wait when
    every stream steps in turn)."""
    passes, frames = raw.get("encoder passes"), raw.get("encoder frames")
    if encoder is None or not passes or frames is None:
        return {"encoder passes": passes, "encoder floor s per audio s": None}
    floor = encoder * frames / WINDOW_FRAMES
    spent = raw.get("encoder s")
    return {
        "encoder passes": passes,
        "encoder s in server": round(spent, 1) if spent is not None else None,
        "encoder floor s": round(floor, 1),
        "encoder floor s per audio s": round(floor / audio, 3) if audio else None,
        "round of 30 s passes s": round(n * encoder, 2),
    }


def where_lag_goes(door: str, raw: dict[str, Any], streams: Sequence[Stream], top: int = 5) -> Row:
    """The words that waited longest at one door and level: word, stream, its end, lag."""
    found = []
    for k, (run, stream) in enumerate(zip(raw["streams"], streams, strict=False)):
        live = live_words(run["words"])
        for i, j in matched_pairs(stream.words, live):
            found.append((live[j][2] - stream.words[i][1], k, stream.words[i]))
    found.sort(reverse=True)
    cells = [f"{w!r} s{k} @{end:.1f}s +{lag:.1f}" for lag, k, (w, end) in found[:top]]
    return {"door": door, "streams": len(raw["streams"]), "longest waits": "; ".join(cells)}
