"""Transcripts as files, as the `whisper` command writes them: txt, vtt, srt, tsv and json,
named after the audio (`talk.mp3` -> `OUTPUT_DIR/talk.srt`).

Subtitle cues come from the segments, or, when the segments carry words (`--words`), from the
words: one cue per segment timed by its first and last word, or cut by the line options
(`SubtitleOptions`, whisper's `--max_line_width` ...) with `highlight_words` underlining each
word while it is spoken. SRT is composed by the `srt` library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import srt

from xattn.clients.data import Result, Segment, Word

FORMATS = ("txt", "vtt", "srt", "tsv", "json")


@dataclass(frozen=True)
class SubtitleOptions:
    max_line_width: int | None = None  # characters per line (with max_line_count: cut cues)
    max_line_count: int | None = None  # lines per cue
    max_words_per_line: int | None = None  # words per line
    highlight_words: bool = False  # a cue per word, the word underlined (<u>)


@dataclass(frozen=True)
class Cue:
    start: float  # seconds
    end: float
    text: str


def format_timestamp(seconds: float, always_include_hours: bool, decimal_marker: str) -> str:
    """whisper's HH:MM:SS.mmm (hours only when asked or non-zero)."""
    if seconds < 0:
        raise ValueError(f"a timestamp must not be negative: {seconds}")
    ms = round(seconds * 1000.0)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1_000)
    hours_marker = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_marker}{minutes:02d}:{secs:02d}{decimal_marker}{ms:03d}"


def _lines(segments: Sequence[Segment], o: SubtitleOptions) -> Iterator[list[Word]]:
    """whisper's iterate_subtitles: words grouped into cues; a word starting a new line of a
    cue carries a leading newline."""
    preserve_segments = o.max_line_count is None or o.max_line_width is None
    max_line_width = o.max_line_width or 1000
    max_words = o.max_words_per_line or 1000
    line_len, line_count = 0, 1
    subtitle: list[Word] = []
    last = next((w.start for s in segments for w in s.words), None)
    last = last if last is not None else (segments[0].start if segments else 0.0)
    for segment in segments:
        for chunk in range(0, len(segment.words), max_words):
            for i, word in enumerate(segment.words[chunk : chunk + max_words]):
                long_pause = not preserve_segments and word.start - last > 3.0
                has_room = line_len + len(word.word) <= max_line_width
                seg_break = i == 0 and len(subtitle) > 0 and preserve_segments
                if line_len > 0 and has_room and not long_pause and not seg_break:
                    line_len += len(word.word)  # the line goes on
                else:
                    word = replace(word, word=word.word.strip())
                    cue_break = (
                        len(subtitle) > 0
                        and o.max_line_count is not None
                        and (long_pause or line_count >= o.max_line_count)
                    )
                    if cue_break or seg_break:
                        yield subtitle
                        subtitle, line_count = [], 1
                    elif line_len > 0:  # a new line in the cue
                        line_count += 1
                        word = replace(word, word="\n" + word.word)
                    line_len = len(word.word.strip())
                subtitle.append(word)
                last = word.start
    if subtitle:
        yield subtitle


def cues(result: Result, options: SubtitleOptions | None = None) -> list[Cue]:
    """The subtitle cues of `result`, as whisper's writers cut them."""
    o = options or SubtitleOptions()
    segments = result.segments
    if not any(s.words for s in segments):
        return [Cue(s.start, s.end, s.text.strip().replace("-->", "->")) for s in segments]
    out: list[Cue] = []
    for subtitle in _lines(segments, o):
        # "-->" would end a cue's text early; whisper escapes it in segments' text only
        subtitle = [replace(w, word=w.word.replace("-->", "->")) for w in subtitle]
        text = "".join(w.word for w in subtitle)
        start, end = subtitle[0].start, subtitle[-1].end
        if not o.highlight_words:
            out.append(Cue(start, end, text))
            continue
        last = start
        for i, this in enumerate(subtitle):
            if round(last * 1000) != round(this.start * 1000):
                out.append(Cue(last, this.start, text))
            underlined = [
                re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", w.word) if j == i else w.word
                for j, w in enumerate(subtitle)
            ]
            out.append(Cue(this.start, this.end, "".join(underlined)))
            last = this.end
    return out


def to_txt(result: Result, options: SubtitleOptions | None = None) -> str:
    return "".join(s.text.strip() + "\n" for s in result.segments)


def to_vtt(result: Result, options: SubtitleOptions | None = None) -> str:
    def stamp(t: float) -> str:
        return format_timestamp(t, always_include_hours=False, decimal_marker=".")

    body = "".join(
        f"{stamp(c.start)} --> {stamp(c.end)}\n{c.text}\n\n" for c in cues(result, options)
    )
    return "WEBVTT\n\n" + body


def to_srt(result: Result, options: SubtitleOptions | None = None) -> str:
    def delta(t: float) -> timedelta:
        return timedelta(milliseconds=round(t * 1000.0))

    subtitles = [
        srt.Subtitle(i, delta(c.start), delta(c.end), c.text)
        for i, c in enumerate(cues(result, options), start=1)
    ]
    return srt.compose(subtitles, reindex=False)


def to_tsv(result: Result, options: SubtitleOptions | None = None) -> str:
    rows = [
        f"{round(1000 * s.start)}\t{round(1000 * s.end)}\t{s.text.strip().replace(chr(9), ' ')}\n"
        for s in result.segments
    ]
    return "start\tend\ttext\n" + "".join(rows)


def to_json(result: Result, options: SubtitleOptions | None = None) -> str:
    doc = {
        "text": result.text,
        "segments": [s.to_dict() for s in result.segments],
        "language": result.language,
        "duration": round(result.duration, 3),
    }
    return json.dumps(doc, ensure_ascii=False)


WRITERS: dict[str, Callable[[Result, SubtitleOptions | None], str]] = {
    "txt": to_txt,
    "vtt": to_vtt,
    "srt": to_srt,
    "tsv": to_tsv,
    "json": to_json,
}


def write_result(
    result: Result,
    audio_path: str | Path,
    output_dir: str | Path,
    output_format: str = "all",
    options: SubtitleOptions | None = None,
) -> list[Path]:
    """Write `OUTPUT_DIR/<audio name without extension>.<ext>` for the format, or for every
    format with "all"; the paths written."""
    formats = FORMATS if output_format == "all" else (output_format,)
    stem = Path(audio_path).stem
    paths = []
    for fmt in formats:
        path = Path(output_dir) / f"{stem}.{fmt}"
        path.write_text(WRITERS[fmt](result, options), encoding="utf-8")
        paths.append(path)
    return paths
