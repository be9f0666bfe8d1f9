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

from xattn.model.audio import SAMPLE_RATE, check_audio
from xattn.model.batching import StepBatcher
from xattn.model.checkpoints import Checkpoint, load_checkpoint
from xattn.model.decoding import TASKS, DecodeOptions, OptionsError
from xattn.model.dims import ModelDims
from xattn.model.logits import int8_supported
from xattn.model.tokenizer import Tokenizer
from xattn.model.transcribe import Context, Event, transcribe
from xattn.model.whisper import Whisper
from xattn.model.words import WordAligner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pipeline:
    name: str
    checkpoint_dtype: str  # how the weights were stored
    compute: str  # the compute path that runs, e.g. "fp32"
    device: str
    context: Context
    alignment_heads: tuple[tuple[int, int], ...]

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

    def transcribe(
        self, audio: np.ndarray, options: DecodeOptions | None = None
    ) -> Iterator[Event]:
        """Events of the transcription of 16 kHz mono float32 `audio` (xattn.model.transcribe)."""
        options = options or DecodeOptions()
        self.validate(options)
        audio = check_audio(audio)
        events = transcribe(self.context, audio, options)
        while True:  # grad mode is thread-local: set it around each step, not across yields
            with torch.inference_mode():
                event = next(events, None)
            if event is None:
                return
            yield event

    def batched(self, max_batch: int = 16) -> Pipeline:
        """This pipeline with a StepBatcher: transcriptions running on several threads share
        each cached decoder step's forward (xattn.model.batching)."""
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


def resolve_compute(compute: str, device: str = "cpu") -> str:
    """ "auto" -> the fastest path that transcribes token-identically to fp32 here: on a CPU,
    "int8-logits" (where torch has fbgemm's int8 kernels), plus "bf16-encoder" where the CPU has
    native bf16; elsewhere "fp32". Other values pass through."""
    if compute != "auto":
        return compute
    if torch.device(device).type != "cpu":
        return "fp32"
    parts = (("bf16-encoder", _cpu_has_bf16()), ("int8-logits", int8_supported()))
    return "+".join(name for name, ok in parts if ok) or "fp32"


def build_pipeline(ckpt: Checkpoint, device: str = "cpu", compute: str = "fp32") -> Pipeline:
    compute = resolve_compute(compute, device)
    model = Whisper(ckpt.dims)
    model.load_state_dict(ckpt.state_dict)
    model.eval().to(device)
    model.set_compute(compute)
    if "bf16" in compute and torch.device(device).type == "cpu" and not _cpu_has_bf16():
        log.warning("this CPU has no native bf16: %s will be slower than fp32", compute)
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
    return Pipeline(ckpt.name, ckpt.dtype, compute, str(device), context, heads)


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def load_pipeline(
    name_or_path: str | Path = "tiny.en", device: str = "cpu", compute: str = "fp32"
) -> Pipeline:
    """Load `tiny.en`, `base`, a CTranslate2 directory or an openai-whisper `.pt` file.

    compute: "fp32" (exact, the default), one of xattn.model.whisper.COMPUTES or "auto"
    (resolve_compute)."""
    t0 = time.perf_counter()
    pipe = build_pipeline(load_checkpoint(name_or_path), device, compute)
    seconds = time.perf_counter() - t0
    log.info("loaded %s (%s) on %s in %.2f s", pipe.name, pipe.compute, device, seconds)
    return pipe
