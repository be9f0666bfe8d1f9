"""Model dimensions, named as in openai-whisper."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    n_mels: int
    n_audio_ctx: int  # encoder frames per 30 s window: 1500
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int  # decoder positions: 448
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.is_multilingual)
