"""clients/writers.py: the files `xattn transcribe -o DIR -f FORMAT` writes, byte for byte
those of the `whisper` command's writers (whisper.utils) given the same segments and words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import srt
import webvtt
from whisper.utils import format_timestamp as whisper_timestamp
from whisper.utils import get_writer

from xattn.clients.data import ModelInfo, Result, Segment, Word
from xattn.clients.writers import FORMATS, SubtitleOptions, format_timestamp, write_result

INFO = ModelInfo("tiny.en", 4, 6, 384, 448, 1500, 384, 4, 6, 80, 51864, (), ("en",), False)
WORDS = [  # (word, start, end): two segments, a long pause inside the second
    [(" And", 0.0, 0.32), (" so,", 0.32, 0.6), (" my", 0.6, 1.1), (" fellow", 1.1, 1.5)],
    [(" ask", 3.2, 3.5), (" not", 3.5, 3.9), (" ->", 3.9, 4.0), (" what", 7.5, 7.9)],
    [(" your", 3601.25, 3601.5), (" country", 3601.5, 3602.0049), (" can\tdo.", 3602.1, 3602.9)],
]


def result(words: bool, arrows: bool = False) -> Result:
    segments = []
    for i, ws in enumerate(WORDS):
        if arrows:  # a word that is "-->"
            ws = [(w.replace("->", "-->"), s, e) for w, s, e in ws]
        segments.append(
            Segment(
                id=i,
                window=i,
                start=ws[0][1],
                end=ws[-1][2],
                text="".join(w for w, _, _ in ws),
                tokens=(1, 2, 3),
                temperature=0.0,
                avg_logprob=-0.25,
                compression_ratio=1.2,
                no_speech_prob=0.01,
                words=tuple(Word(w, s, e, 0.9) for w, s, e in ws) if words else (),
            )
        )
    text = "".join(s.text for s in segments)
    return Result(text, "en", 3603.0, segments, [], None, INFO)


def whisper_dict(r: Result, words: bool) -> dict:
    segments = [s.to_dict() for s in r.segments]
    for s, ours in zip(segments, r.segments, strict=True):
        s["start"], s["end"] = ours.start, ours.end  # unrounded, as whisper keeps them
        if words:
            s["words"] = [
                {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                for w in ours.words
            ]
        else:
            del s["words"]
    return {"text": r.text, "segments": segments, "language": r.language}


@pytest.mark.parametrize("seconds", [0.0, 0.0004, 0.0005, 1.2345, 59.9996, 3599.9995, 7322.5])
def test_timestamps_as_whisper(seconds: float) -> None:
    for hours, marker in ((False, "."), (True, ",")):
        assert format_timestamp(seconds, hours, marker) == whisper_timestamp(seconds, hours, marker)


LINE_OPTIONS = [
    SubtitleOptions(),
    SubtitleOptions(max_line_width=12, max_line_count=2),
    SubtitleOptions(max_words_per_line=2),
    SubtitleOptions(highlight_words=True),
    SubtitleOptions(max_line_width=10, max_line_count=1, highlight_words=True),
]


CASES = [(False, SubtitleOptions())] + [(True, o) for o in LINE_OPTIONS]  # lines cut words


@pytest.mark.parametrize(("words", "options"), CASES, ids=str)
def test_files_as_whisper_writes_them(tmp_path: Path, words: bool, options: SubtitleOptions):
    r = result(words)
    ours, theirs = tmp_path / "ours", tmp_path / "whisper"
    ours.mkdir(), theirs.mkdir()
    written = write_result(r, "/some/where/talk.en.mp3", ours, "all", options)
    assert [p.name for p in written] == [f"talk.en.{f}" for f in FORMATS]
    kwargs = {k: v for k, v in vars(options).items() if v}
    get_writer("all", str(theirs))(whisper_dict(r, words), "talk.en.mp3", kwargs)
    for fmt in ("txt", "vtt", "srt", "tsv"):
        name = f"talk.en.{fmt}"
        assert (ours / name).read_text() == (theirs / name).read_text(), fmt
    doc = json.loads((ours / "talk.en.json").read_text())
    assert doc["text"] == r.text and len(doc["segments"]) == 3


def test_subtitles_parse_back(tmp_path: Path) -> None:
    """The SRT and VTT read back (srt, webvtt-py) as the words' cues, to the millisecond;
    "-->" in a word is written "->" (whisper escapes it only in segment text)."""
    r = result(words=True, arrows=True)
    write_result(r, "clip.wav", tmp_path, "all", SubtitleOptions(max_words_per_line=1))
    expected = [
        (round(w.start, 3), round(w.end, 3), w.word.strip().replace("-->", "->"))
        for s in r.segments
        for w in s.words
    ]
    subs = list(srt.parse((tmp_path / "clip.srt").read_text()))
    assert [(s.start.total_seconds(), s.end.total_seconds(), s.content) for s in subs] == expected
    vtt = webvtt.read(str(tmp_path / "clip.vtt"))
    assert [(c.start_in_seconds, c.end_in_seconds, c.text) for c in vtt] == [
        (int(s), int(e), t) for s, e, t in expected
    ]
    assert [c.start for c in vtt][-1] == "01:00:02.100"  # hours appear past the hour
