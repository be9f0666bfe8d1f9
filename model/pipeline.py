"""A loaded model ready to transcribe: checkpoint, tokenizer, suppress lists, aligner.

pipe = load_pipeline("tiny.en")
for event in pipe.transcribe(audio, DecodeOptions(return_attention=True)):
    ...
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from xattn.model.audio.features import SAMPLE_RATE, check_audio
from xattn.model.audio.vad import VadOptions, detect_speech
from xattn.model.checkpoints import Checkpoint, load_checkpoint
from xattn.model.decode.beams import check_search_options
from xattn.model.decode.decoding import TASKS, DecodeOptions, OptionsError
from xattn.model.decode.options import validate_options
from xattn.model.decode.step_batcher import StepBatcher, model_work
from xattn.model.decode.tokenizer import Tokenizer
from xattn.model.net.dims import ModelDims
from xattn.model.net.logits import int8_supported
from xattn.model.net.whisper import COMPUTES, Whisper
from xattn.model.transcribe.batched import chunk_spans, transcribe_batched
from xattn.model.transcribe.sequential import Context, Event, transcribe
from xattn.model.transcribe.vad_filter import check_vad_options, speech_events
from xattn.model.transcribe.words import WordAligner

log = logging.getLogger(__name__)
_BF16_NOTE = (
    "approximate: the encoder in bf16 moves word times (measured: up to 0.08 s on a clip with "
    "leading silence and trailing noise, 0.34 s on 75 s of mixed speech and silence) and can "
    "change the text (base diverged after the first sentence there; tiny.en at the 32nd token "
    "of benchmarks/approx.py's 55 s generated clip, word times off by 0.02 s on its 12 s one)"
)
_INT8_NOTE = (
    "approximate: the encoder's layer maps in int8 (fbgemm, any x86 CPU) move word times "
    "(jfk.flac, tiny.en: one segment timestamp 0.2 s later, words within 0.04 s) and can "
    "change words (the shared evaluation set, greedy, words changed against fp32's "
    "transcripts: tiny.en 2 of 324, base 8 of 452; faster-whisper's int8 changes 4 and 11)"
)
# compute paths that are not exact, with their measured differences (GetModelInfo, --help)
APPROXIMATE = {
    "bf16-encoder": _BF16_NOTE,
    "bf16-encoder+int8-logits": _BF16_NOTE,
    "int8-encoder": _INT8_NOTE,
    "int8-encoder+int8-logits": _INT8_NOTE,
}
ALIASES = {"int8": "int8-encoder+int8-logits"}  # faster-whisper's compute_type name


@dataclass(frozen=True)
class Pipeline:
    name: str
    checkpoint_dtype: str  # how the weights were stored
    compute: str  # the compute path that runs, e.g. "fp32"
    device: str
    context: Context
    alignment_heads: tuple[tuple[int, int], ...]
    # "checkpoint", or the rule that chose them (xattn.model.checkpoints.HEADS_DEFAULT_RULE)
    alignment_heads_source: str = "checkpoint"
    checkpoint_format: str = "ctranslate2"  # "ctranslate2", "openai" or "huggingface"

    @property
    def model(self) -> Whisper:
        return self.context.model

    @property
    def tokenizer(self) -> Tokenizer:
        return self.context.tokenizer

    @property
    def dims(self) -> ModelDims:
        return self.context.model.dims

    @property
    def is_multilingual(self) -> bool:
        return self.tokenizer.multilingual

    @property
    def languages(self) -> tuple[str, ...]:
        return self.tokenizer.languages

    def summary(self) -> str:
        """The weights' memory and the model's shape, for a start-up log (one line)."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        mib = sum(t.numel() * t.element_size() for t in tensors) / 2**20
        d = self.dims
        return (
            f"{mib:.0f} MiB of weights ({self.checkpoint_format}, stored "
            f"{self.checkpoint_dtype}, run {self.compute}); {d.n_audio_layer}+{d.n_text_layer} "
            f"layers, width {d.n_audio_state}, {d.n_mels} mel bins, vocabulary {d.n_vocab}"
        )

    def validate(self, options: DecodeOptions) -> None:
        """Raise OptionsError, naming the problem, for options this model cannot honour."""
        if options.language is not None and options.language not in self.languages:
            known = ", ".join(self.languages[:12]) + (" …" if len(self.languages) > 12 else "")
            raise OptionsError(f"unknown language {options.language!r} for {self.name} ({known})")
        if options.task not in TASKS:
            raise OptionsError(f"unknown task {options.task!r} (transcribe or translate)")
        if options.task == "translate" and not self.is_multilingual:
            raise OptionsError(f"{self.name} is English-only: it cannot translate")
        if not options.temperatures:
            raise OptionsError("temperatures must not be empty")
        for t in options.temperatures:
            if not (0.0 <= t <= 10.0) or t != t:
                raise OptionsError(f"temperature {t} is outside [0, 10]")
        if (
            options.sample_len is not None
            and not 0 < options.sample_len <= self.dims.n_text_ctx // 2
        ):
            raise OptionsError(f"sample_len must be in 1..{self.dims.n_text_ctx // 2}")
        validate_options(options, self.dims.n_vocab)
        check_search_options(options)
        check_vad_options(options)

    def transcribe(
        self, audio: np.ndarray, options: DecodeOptions | None = None
    ) -> Iterator[Event]:
        """Events of the transcription of 16 kHz mono float32 `audio` (transcribe.sequential)."""
        options = options or DecodeOptions()
        self.validate(options)
        audio = check_audio(audio)
        spans = None
        if options.vad_filter:  # the speech only, times mapped back (transcribe.vad_filter)
            if options.batch_size is not None:  # spans cut at every pause (batched.chunk_spans)
                find, vad = chunk_spans, options.vad_options
            else:
                find, vad = detect_speech, options.vad_options or VadOptions()
            spans = model_work(self.context.batcher)(find, audio, vad)
            if options.batch_size is None:
                yield from speech_events(self.transcribe, audio, options, spans)
                return
        if options.batch_size is not None:  # independent windows, N at once
            events = transcribe_batched(self.context, audio, options, options.batch_size, spans)
        else:
            events = transcribe(self.context, audio, options)
        while True:  # grad mode is thread-local: set it around each step, not across yields
            with torch.inference_mode():
                event = next(events, None)
            if event is None:
                return
            yield event

    def batched(self, max_batch: int = 16) -> Pipeline:
        """This pipeline with a StepBatcher: transcriptions running on several threads share
        each cached decoder step's forward (xattn.model.decode.step_batcher)."""
        batcher = StepBatcher(self.model, max_batch=max_batch)
        return dataclasses.replace(self, context=dataclasses.replace(self.context, batcher=batcher))

    def warm_up(self) -> float:
        """Run one short decode so the first request does not pay for lazy initialisation."""
        t0 = time.perf_counter()
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
        silence[::160] = 1e-3  # not all zeros: a real (if silent) input
        for _ in self.transcribe(silence, DecodeOptions(temperatures=(0.0,), sample_len=4)):
            pass
        return time.perf_counter() - t0


@dataclass(frozen=True)
class CpuCapability:
    """What the CPU (and this torch build) offers the compute paths."""

    int8: bool  # fbgemm's int8 kernels (x86)
    bf16: bool  # native bf16 (AVX-512 BF16, AMX)

    @classmethod
    def detect(cls) -> CpuCapability:
        return cls(int8=int8_supported(), bf16=_cpu_has_bf16())


def resolve_compute(compute: str, device: str = "cpu", cpu: CpuCapability | None = None) -> str:
    """ "auto" -> the fastest exact path here (token-identical to fp32, the same word times):
    "int8-logits" on a CPU where torch has fbgemm's int8 kernels, "fp32" elsewhere. The
    approximate paths (APPROXIMATE) run only when asked by name, whatever bf16 or int8 the
    CPU has. An alias (ALIASES) -> its compute; other values pass through."""
    if compute != "auto":
        return ALIASES.get(compute, compute)
    if torch.device(device).type == "cpu" and (cpu or CpuCapability.detect()).int8:
        return "int8-logits"
    return "fp32"


def compute_note(compute: str) -> tuple[bool, str]:
    """Whether `compute` transcribes exactly as fp32, and what differs where it does not."""
    note = APPROXIMATE.get(ALIASES.get(compute, compute))
    return (note is None, note or "exact: the same tokens and word times as fp32")


COMPUTE_CHOICES = (*COMPUTES, *ALIASES, "auto")  # what --compute accepts
LIVE_COMPUTES = ("auto", "model", "fp32", "bf16", "int8")  # what --live-compute accepts


def resolve_live_precision(
    live_compute: str, compute: str, device: str = "cpu", cpu: CpuCapability | None = None
) -> str | None:
    """The encoder's precision in live steps (AudioEncoder.PRECISIONS), None: the model's
    compute (`compute`, resolved). Live has no token-exact reference (its finals are cut by the
    live policy), so its default is judged by lag and WER: "auto" is "bf16" where the CPU runs
    it natively (AVX-512 BF16, AMX) and the model's encoder is fp32 (its finals' WER within
    0.5 pp of fp32's, benchmarks/live_wer.py), else the model's; "model": the model's."""
    if live_compute not in LIVE_COMPUTES:
        raise ValueError(f"unknown live compute {live_compute!r} (one of {LIVE_COMPUTES})")
    if live_compute == "model":
        return None
    if live_compute != "auto":
        return live_compute
    encoder = COMPUTES[resolve_compute(compute, device, cpu)][0]
    on_cpu = torch.device(device).type == "cpu"
    return "bf16" if on_cpu and encoder == "fp32" and (cpu or CpuCapability.detect()).bf16 else None


def compute_help() -> str:
    """The --compute choices for a command's help, the approximate ones marked as such."""
    return (
        "fp32 (exact), int8-logits (exact: int8 output projection, deciding logits rescored "
        "in fp32), bf16-encoder (APPROXIMATE: ~2.7x faster encoder where the CPU has native "
        "bf16, AVX-512 BF16 or AMX; word times move by up to ~0.3 s and text can change), "
        "int8-encoder (APPROXIMATE: the encoder's layer maps in int8, faster on any x86 CPU; "
        "word times move and text can change), bf16-encoder+int8-logits and "
        "int8-encoder+int8-logits (APPROXIMATE; int8 is the latter), or auto (the fastest "
        "exact path here: int8-logits where fbgemm runs, else fp32); measured: "
        "benchmarks/approx.py, benchmarks/wer.py --computes"
    )


def build_pipeline(ckpt: Checkpoint, device: str = "cpu", compute: str = "fp32") -> Pipeline:
    compute = resolve_compute(compute, device)
    model = Whisper(ckpt.dims)
    model.load_state_dict(ckpt.state_dict)
    model.eval().to(device)
    model.set_compute(compute)
    if model.device.type == "cpu":
        log.info("decoder step kernels on this CPU: %s", model.decoder.choose_kernels())
    if "bf16" in compute and torch.device(device).type == "cpu" and not _cpu_has_bf16():
        log.warning("this CPU has no native bf16: %s will be slower than fp32", compute)
    if compute in APPROXIMATE:
        log.warning("compute %s: %s", compute, APPROXIMATE[compute])
    tokenizer = Tokenizer(
        ckpt.tokenizer_file,
        multilingual=ckpt.dims.is_multilingual,
        num_languages=ckpt.dims.num_languages,
    )
    suppress = set(ckpt.suppress_tokens or tokenizer.non_speech_tokens) | set(tokenizer.task_ids)
    suppress_blank = ckpt.suppress_blank or (*tokenizer.encode(" "), tokenizer.eot)
    heads = ckpt.alignment_heads
    for layer, head in heads:
        if not (0 <= layer < ckpt.dims.n_text_layer and 0 <= head < ckpt.dims.n_text_head):
            raise ValueError(f"{ckpt.name}: alignment head ({layer}, {head}) does not exist")
    context = Context(
        model=model,
        tokenizer=tokenizer,
        suppress=tuple(sorted(suppress)),
        suppress_blank=tuple(suppress_blank),
        aligner=WordAligner(model, tokenizer, heads),
    )
    return Pipeline(
        ckpt.name,
        ckpt.dtype,
        compute,
        str(device),
        context,
        heads,
        ckpt.alignment_heads_source,
        ckpt.format,
    )


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def load_pipeline(
    name_or_path: str | Path = "tiny.en", device: str = "cpu", compute: str = "fp32"
) -> Pipeline:
    """Load `tiny.en`, `base`, a CTranslate2 directory or an openai-whisper `.pt` file.

    compute: "fp32" (exact, the default), one of xattn.model.net.whisper.COMPUTES, an alias
    (ALIASES) or "auto" (resolve_compute)."""
    t0 = time.perf_counter()
    pipe = build_pipeline(load_checkpoint(name_or_path), device, compute)
    seconds = time.perf_counter() - t0
    log.info("loaded %s (%s) on %s in %.2f s", pipe.name, pipe.compute, device, seconds)
    return pipe
