"""service.engine.rows and .convert without a server: selection, packing, request checks."""

from __future__ import annotations

import numpy as np
import pytest

from xattn.model.audio.features import AudioError, AudioTooLongError
from xattn.model.decode.decoding import DEFAULT_TEMPERATURES, OptionsError
from xattn.model.decode.results import TokenEvent, Transcript, WindowDiscarded, WindowStart
from xattn.model.live.types import LiveOptions
from xattn.model.net.dims import ModelDims
from xattn.service.engine import convert, convert_live
from xattn.service.engine.rows import RowSpec, row_spec, unpack
from xattn.v1 import transcriber_pb2 as pb

DIMS = ModelDims(80, 1500, 384, 6, 4, 51864, 448, 384, 6, 4)
HEADS = ((1, 0), (2, 0), (3, 4))


def attention(seed: int = 0) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(size=(4, 6, 1500)).astype(np.float32)
    weights = np.exp(logits)
    return weights / weights.sum(axis=-1, keepdims=True)  # [layers, heads, 1500]


def spec(default: int = pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS, **options: object) -> RowSpec:
    return row_spec(pb.AlignmentOptions(**options), default, DIMS, HEADS)


def test_mean_of_alignment_heads_as_float16() -> None:
    rows = spec()
    a = attention()
    tensor = rows.tensor(rows.select(a))
    assert list(tensor.shape) == [1, 1500] and tensor.data_type == pb.DATA_TYPE_FLOAT16
    assert tensor.data == a[[1, 2, 3], [0, 0, 4]].mean(axis=0).astype("<f2").tobytes()
    assert abs(unpack(tensor).sum() - 1.0) < 1e-3


def test_all_heads_and_listed_heads_as_float32() -> None:
    a = attention(1)
    every = spec(mode=pb.ALIGNMENT_MODE_ALL_HEADS, data_type=pb.DATA_TYPE_FLOAT32)
    np.testing.assert_array_equal(unpack(every.tensor(every.select(a))), a.reshape(24, 1500))
    heads = [pb.AttentionHead(layer=3, head=5), pb.AttentionHead(layer=0, head=1)]
    listed = spec(heads=heads, data_type=pb.DATA_TYPE_FLOAT32)  # mode unset + heads: HEADS
    assert listed.mode == pb.ALIGNMENT_MODE_HEADS
    tensor = listed.tensor(listed.select(a))
    assert tensor.data == a[[3, 0], [5, 1]].astype("<f4").tobytes()  # little-endian, row-major


def test_defaults_and_bad_alignment_options() -> None:
    assert not spec(pb.ALIGNMENT_MODE_NONE).enabled
    assert spec().mode == pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS
    with pytest.raises(OptionsError, match="does not exist"):
        spec(heads=[pb.AttentionHead(layer=4, head=0)])
    with pytest.raises(OptionsError, match="does not exist"):
        spec(heads=[pb.AttentionHead(layer=0, head=-1)])
    with pytest.raises(OptionsError, match="only for ALIGNMENT_MODE_HEADS"):
        spec(mode=pb.ALIGNMENT_MODE_ALL_HEADS, heads=[pb.AttentionHead()])
    with pytest.raises(OptionsError, match="data type"):
        spec(data_type=7)


def test_decode_options() -> None:
    default = convert.decode_options(pb.TranscriptionOptions(), return_attention=True)
    assert default.temperatures == DEFAULT_TEMPERATURES and default.language is None
    assert default.condition_on_previous_text and default.return_attention
    assert default.task == "transcribe"
    options = pb.TranscriptionOptions(
        language="de", task=pb.TASK_TRANSLATE, temperatures=[0], word_timestamps=True
    )
    options.condition_on_previous_text = False
    got = convert.decode_options(options, return_attention=False)
    assert (got.language, got.task, got.temperatures) == ("de", "translate", (0.0,))
    assert got.word_timestamps and not got.condition_on_previous_text
    for bad in ([-1.0], [float("nan")], [float("inf")]):
        with pytest.raises(OptionsError, match="temperature"):
            convert.decode_options(pb.TranscriptionOptions(temperatures=bad), False)


def test_audio_loader_checks_before_decoding() -> None:
    int16 = pb.PCM_ENCODING_INT16
    with pytest.raises(AudioError, match="no audio"):
        convert.audio_loader(pb.Audio(), 60)
    with pytest.raises(AudioError, match="empty"):
        convert.audio_loader(pb.Audio(encoded=b""), 60)
    with pytest.raises(AudioError, match="sample_rate"):
        convert.audio_loader(pb.Audio(pcm=pb.Pcm(data=b"\0\0", encoding=int16)), 60)
    too_long = pb.Pcm(data=bytes(2 * 8000 * 61), sample_rate=8000, encoding=int16)
    with pytest.raises(AudioTooLongError, match="too long"):
        convert.audio_loader(pb.Audio(pcm=too_long), 60)
    stereo = pb.Pcm(
        data=np.ones(3200, "<f4").tobytes() * 2,
        sample_rate=8000,
        channels=2,
        encoding=pb.PCM_ENCODING_FLOAT32,
    )
    audio = convert.audio_loader(pb.Audio(pcm=stereo), 60)()
    assert audio.dtype == np.float32 and abs(len(audio) - 6400) <= 2  # 0.4 s at 16 kHz


def test_discarded_attempts_leave_the_stacked_rows() -> None:
    rows = spec(mode=pb.ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS)
    a = attention(2)

    def token(index: int, temperature: float, token_id: int = 400) -> TokenEvent:
        return TokenEvent(index, token_id, " x", -0.1, 0, temperature, attention=a)

    shaper = convert.UnaryShaper(rows)
    stream = convert.StreamShaper(rows, eot=50256)
    script = [
        WindowStart(0, 0.0, 550, "en"),
        token(0, 0.0),
        token(1, 0.0, 50256),
        WindowDiscarded(0, 0.0, "compression_ratio"),
        token(2, 0.2),
        token(3, 0.2, 50256),
        Transcript(text=" x", language="en", segments=(), duration=11.0),
    ]
    answers = [shaper(event) for event in script]
    kinds = [stream(event).WhichOneof("event") for event in script]
    assert kinds == ["window_start", "token", "token", "window_discarded", "token", "token", "done"]
    assert stream(script[2]).token.kind == pb.TOKEN_KIND_END_OF_TEXT
    assert answers[:-1] == [None] * 6
    (window,) = answers[-1].windows
    assert list(window.token_indices) == [2, 3] and list(window.token_ids) == [400, 50256]
    assert unpack(window.matrix).shape == (2, 1, 1500)


def test_live_policy_over_the_defaults() -> None:
    defaults = LiveOptions(first_context=1.5)
    config = pb.StreamingRecognitionConfig(policy=pb.LivePolicy(commit_margin=0.5))
    options = convert_live.live_options(config, defaults)
    assert (options.commit_margin, options.agreement, options.first_context) == (0.5, True, 1.5)
    config.policy.first_context = 0.0
    assert convert_live.live_options(config, defaults).first_context == 0.0
    for bad in (-1.0, float("nan"), 1e9):
        config.policy.first_context = bad
        with pytest.raises(OptionsError, match="policy.first_context must be in 0..25 s"):
            convert_live.live_options(config, defaults)


def test_live_beams_from_the_policy_over_the_servers() -> None:
    config = pb.StreamingRecognitionConfig()
    assert convert_live.live_options(config, LiveOptions(beam_size=5)).beam_size == 5
    config.policy.beam_size = 1
    assert convert_live.live_options(config, LiveOptions(beam_size=5)).beam_size == 1
    for bad in (0, 17):
        config.policy.beam_size = bad
        with pytest.raises(OptionsError, match=f"policy.beam_size must be in 1..16, not {bad}"):
            convert_live.live_options(config, LiveOptions())
