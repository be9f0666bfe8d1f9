"""Whisper's tokenizer, read from a checkpoint's tokenizer.json with `tokenizers`.

The special tokens are found by name in the file. The 1,501 timestamp tokens `<|0.00|>` …
`<|30.00|>` are not in tokenizer.json: they are the ids right after `<|notimestamps|>`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

TIME_PRECISION = 0.02  # seconds per timestamp token
N_TIMESTAMPS = 1501
# languages openai-whisper added after the first 99, in token order (large-v3: n_vocab 51866)
LATER_LANGUAGES = ("yue",)
# openai-whisper's defaults of the punctuation that word timestamps join to a neighbour word
# (DecodeOptions.prepend_punctuations / append_punctuations; transcribe.alignment merges them)
PREPEND_PUNCTUATIONS = "\"'“¿([{-"  # merged into the following word
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"  # merged into the preceding word


@dataclass(frozen=True)
class Specials:
    eot: int
    sot: int
    translate: int
    transcribe: int
    sot_lm: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    language_ids: tuple[int, ...]
    language_codes: tuple[str, ...]

    @property
    def timestamp_begin(self) -> int:
        return self.no_timestamps + 1


def read_specials(hf: HFTokenizer, num_languages: int) -> Specials:
    vocab = hf.get_vocab(with_added_tokens=True)

    def tok(*names: str) -> int:
        for name in names:
            if name in vocab:
                return vocab[name]
        raise ValueError(f"tokenizer.json has none of {names}")

    sot, translate = tok("<|startoftranscript|>"), tok("<|translate|>")
    langs = sorted((i, s[2:-2]) for s, i in vocab.items() if sot < i < translate)
    langs = langs[:num_languages]
    return Specials(
        eot=tok("<|endoftext|>"),
        sot=sot,
        translate=translate,
        transcribe=tok("<|transcribe|>"),
        sot_lm=tok("<|startoflm|>"),
        sot_prev=tok("<|startofprev|>"),
        no_speech=tok("<|nospeech|>", "<|nocaptions|>"),
        no_timestamps=tok("<|notimestamps|>"),
        language_ids=tuple(i for i, _ in langs),
        language_codes=tuple(code for _, code in langs),
    )


def add_language_tokens(spec: dict, codes: tuple[str, ...]) -> dict:
    """tokenizer.json's content with language tokens `codes` added after the last language
    (before `<|translate|>`), the specials after it shifted up, as openai-whisper numbers them."""
    added = spec["added_tokens"]
    translate = next(t["id"] for t in added if t["content"] == "<|translate|>")
    n = len(codes)
    for t in added:
        t["id"] += n if t["id"] >= translate else 0
    template = next(t for t in added if t["content"] == "<|translate|>")
    for k, code in enumerate(codes):
        added.append({**template, "id": translate + k, "content": f"<|{code}|>"})
    added.sort(key=lambda t: t["id"])
    for special in (spec.get("post_processor") or {}).get("special_tokens", {}).values():
        special["ids"] = [i + n if i >= translate else i for i in special["ids"]]
    return spec


def _read(path: Path, multilingual: bool, num_languages: int) -> HFTokenizer:
    """The file's tokenizer; a multilingual one with fewer languages than the model's gets
    openai-whisper's later ones (`yue` for n_vocab 51866)."""
    hf = HFTokenizer.from_file(str(path))
    if not multilingual:
        return hf
    have = len(read_specials(hf, num_languages).language_ids)
    missing = LATER_LANGUAGES[max(0, have - 99) : max(0, num_languages - 99)]
    if have >= num_languages or len(missing) != num_languages - have:
        return hf
    spec = add_language_tokens(json.loads(path.read_text(encoding="utf-8")), missing)
    return HFTokenizer.from_str(json.dumps(spec))


class Tokenizer:
    """Text ⇄ ids for one checkpoint. Language and task enter only through `sot_sequence`."""

    def __init__(self, path: str | Path, *, multilingual: bool, num_languages: int) -> None:
        self.path = Path(path)
        self.hf = _read(self.path, multilingual, num_languages)
        self.multilingual = multilingual
        self.specials = s = read_specials(self.hf, num_languages)
        self.eot, self.sot, self.no_timestamps = s.eot, s.sot, s.no_timestamps
        self.timestamp_begin = s.timestamp_begin
        self.no_speech, self.sot_prev = s.no_speech, s.sot_prev

    @property
    def languages(self) -> tuple[str, ...]:
        return self.specials.language_codes if self.multilingual else ("en",)

    def language_token(self, code: str) -> int:
        try:
            return self.specials.language_ids[self.specials.language_codes.index(code)]
        except ValueError:
            raise ValueError(f"unknown language {code!r}") from None

    def sot_sequence(self, language: str | None, task: str = "transcribe") -> tuple[int, ...]:
        """`<|startoftranscript|>`, then language and task for multilingual checkpoints."""
        if not self.multilingual:
            return (self.sot,)
        seq = [self.sot]
        if language is not None:
            seq.append(self.language_token(language))
        task_id = self.specials.translate if task == "translate" else self.specials.transcribe
        return (*seq, task_id)

    @property
    def task_ids(self) -> tuple[int, ...]:
        """Specials never sampled: tasks, start tokens, no-speech."""
        s = self.specials
        return (s.transcribe, s.translate, s.sot, s.sot_prev, s.sot_lm, s.no_speech)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of the ordinary tokens; specials and timestamps are dropped."""
        return self.hf.decode([i for i in ids if i < self.eot], skip_special_tokens=False)

    def decode_with_timestamps(self, ids: list[int]) -> str:
        """Text with specials kept and timestamps written as `<|1.08|>`."""
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            if i >= self.timestamp_begin:
                parts.append(self.hf.decode(run, skip_special_tokens=False))
                parts.append(f"<|{(i - self.timestamp_begin) * TIME_PRECISION:.2f}|>")
                run = []
            else:
                run.append(i)
        parts.append(self.hf.decode(run, skip_special_tokens=False))
        return "".join(parts)

    def token_text(self, token: int) -> str:
        """One token's text ("" for specials and timestamps)."""
        return self.hf.decode([token]) if token < self.eot else ""

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Symbols that should not be spoken, for checkpoints without a suppress list."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        miscellaneous = set("♩♪♫♬♭♮♯")
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + list(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return tuple(sorted(result))
