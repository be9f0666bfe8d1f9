"""Tests of the audio front-end, model/audio/features.py."""

import io
import struct
from pathlib import Path

import av
import numpy as np
import pytest
import soundfile as sf
import torch
import whisper.audio
from hypothesis import given, settings
from hypothesis import strategies as st

from xattn.model.audio.features import (
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    AudioError,
    AudioTooLongError,
    check_audio,
    decode_audio,
    log_mel_spectrogram,
    mel_filters,
    pad_or_trim,
    pcm_to_audio,
)

REPO = Path(__file__).resolve().parents[1]


def _tone(rate: int, channels: int, seconds: float = 2.0, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    mono = 0.5 * np.sin(2 * np.pi * hz * t)
    return np.repeat(mono[:, None], channels, axis=1).astype(np.float32)  # [n, channels]


def _encode(frames: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, frames, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _peak_hz(audio: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    return float(np.argmax(spectrum) * SAMPLE_RATE / len(audio))


def _wav_header(rate: int, channels: int = 1, n_bytes: int = 3200) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", n_bytes)
    body += bytes(n_bytes)
    return b"RIFF" + struct.pack("<I", len(body)) + body


# --- real files -------------------------------------------------------------------------------


def test_jfk_flac_decodes_to_11s_mono_16k(jfk_path: Path) -> None:
    audio = decode_audio(jfk_path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) / SAMPLE_RATE - 11.0) < 0.01
    assert 0.1 < np.abs(audio).max() <= 1.0
    np.testing.assert_array_equal(decode_audio(jfk_path.read_bytes()), audio)
    np.testing.assert_array_equal(decode_audio(str(jfk_path)), audio)


@pytest.mark.requires_tool("ffmpeg")
def test_jfk_close_to_ffmpeg_decode(jfk_path: Path) -> None:
    ours = decode_audio(jfk_path)
    theirs = whisper.audio.load_audio(str(jfk_path))
    n = min(len(ours), len(theirs))
    assert abs(len(ours) - len(theirs)) <= 1
    assert np.abs(ours[:n] - theirs[:n]).mean() < 1e-3  # different resamplers, same signal


def test_multilingual_mp3_decodes_to_60s(multilingual_path: Path) -> None:
    audio = decode_audio(multilingual_path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) / SAMPLE_RATE - 60.0) < 0.5
    assert np.abs(audio).max() <= 1.0


def test_sample_clip_decodes() -> None:
    audio = decode_audio(REPO / "samples" / "hello.wav")
    assert 4.0 < len(audio) / SAMPLE_RATE < 9.0


# --- log-Mel spectrogram ----------------------------------------------------------------------


@pytest.mark.parametrize("n_mels", [80, 128])
def test_filterbank_matches_whisper(n_mels: int) -> None:
    ours = mel_filters(n_mels)
    theirs = whisper.audio.mel_filters("cpu", n_mels)
    assert ours.shape == theirs.shape == (n_mels, 201)
    assert (ours - theirs).abs().max().item() < 1e-6


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("padding", [0, N_SAMPLES])
def test_log_mel_matches_whisper(jfk_path: Path, n_mels: int, padding: int) -> None:
    audio = decode_audio(jfk_path)
    ours = log_mel_spectrogram(audio, n_mels=n_mels, padding=padding)
    theirs = whisper.audio.log_mel_spectrogram(audio, n_mels=n_mels, padding=padding)
    assert ours.shape == theirs.shape == (n_mels, (len(audio) + padding) // 160)
    assert (ours - theirs).abs().max().item() < 1e-4


def test_log_mel_accepts_tensor_and_readonly_array() -> None:
    audio = _tone(SAMPLE_RATE, 1)[:, 0]
    audio.flags.writeable = False
    a = log_mel_spectrogram(audio)
    b = log_mel_spectrogram(torch.from_numpy(audio.copy()), device="cpu")
    assert a.shape == (80, len(audio) // 160)
    assert torch.equal(a, b)


def test_pad_or_trim() -> None:
    x = torch.ones(80, 100)
    assert pad_or_trim(x).shape == (80, N_FRAMES)
    assert pad_or_trim(x)[:, 100:].abs().sum() == 0
    assert pad_or_trim(torch.ones(80, 4000)).shape == (80, N_FRAMES)
    assert pad_or_trim(x, 50, axis=0).shape == (50, 100)
    assert pad_or_trim(x, 90, axis=0)[80:].abs().sum() == 0
    assert pad_or_trim(torch.ones(10), N_SAMPLES).shape == (N_SAMPLES,)
    assert pad_or_trim(x, 100) is x


# --- formats written at test time -------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "channels", "fmt", "subtype"),
    [
        (16000, 1, "WAV", "PCM_16"),
        (16000, 1, "WAV", "FLOAT"),
        (8000, 1, "WAV", "PCM_16"),
        (48000, 6, "WAV", "PCM_24"),
        (44100, 2, "OGG", "VORBIS"),
        (22050, 1, "FLAC", "PCM_16"),
    ],
)
def test_formats_decode_to_16k(rate: int, channels: int, fmt: str, subtype: str) -> None:
    audio = decode_audio(_encode(_tone(rate, channels), rate, fmt, subtype))
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 2 * SAMPLE_RATE) <= 2
    assert abs(_peak_hz(audio) - 440.0) < 2.0
    assert abs(np.abs(audio).max() - 0.5) < 0.05


@pytest.mark.parametrize("subtype", ["PCM_S8", "PCM_16", "PCM_24", "PCM_32", "FLOAT"])
def test_pyav_path_sample_formats(subtype: str) -> None:
    # AU (Sun .snd) is not one of the soundfile-first formats, so PyAV decodes it: packed,
    # big-endian, signed/unsigned integer or float samples.
    frames = _tone(SAMPLE_RATE, 2)
    frames[:, 1] = 0.0
    audio = decode_audio(_encode(frames, SAMPLE_RATE, "AU", subtype))
    np.testing.assert_allclose(audio, frames.mean(axis=1), atol=1 / 64)


def test_stereo_24bit_is_exact_and_averaged() -> None:
    frames = np.zeros((1600, 2), np.float32)
    frames[:, 0] = 0.5
    frames[:, 1] = 3 / 2**23  # the smallest steps survive: 24-bit, not 16-bit
    audio = decode_audio(_encode(frames, SAMPLE_RATE, "WAV", "PCM_24"))
    np.testing.assert_array_equal(audio, np.full(1600, (0.5 + 3 / 2**23) / 2, np.float32))


def test_float_wav_is_clipped_to_unit_range() -> None:
    frames = np.full((1600, 1), 2.0, np.float32)
    audio = decode_audio(_encode(frames, SAMPLE_RATE, "WAV", "FLOAT"))
    assert audio.max() == 1.0


# --- bad input --------------------------------------------------------------------------------


def test_empty_bytes() -> None:
    with pytest.raises(AudioError, match="empty"):
        decode_audio(b"")


def test_random_bytes() -> None:
    with pytest.raises(AudioError, match="cannot decode audio"):
        decode_audio(np.random.default_rng(0).bytes(5000))


def test_mpeg_program_stream_is_refused_not_a_crash(tmp_path: Path) -> None:
    """PyAV 16.1's MPEG-PS demuxer kills the process even on a valid .mpg: it is not one of
    the demuxers that may probe (audio.DEMUXERS), as bytes or as a file."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mpeg") as out:
        stream = out.add_stream("mp2", rate=SAMPLE_RATE, layout="mono")
        samples = _tone(SAMPLE_RATE, 1)[:, 0]  # [n]
        for i in range(0, len(samples), 1152):
            frame = av.AudioFrame.from_ndarray(samples[None, i : i + 1152], "flt", "mono")
            frame.sample_rate = SAMPLE_RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    path = tmp_path / "tone.mpg"
    path.write_bytes(buffer.getvalue())
    for source in (buffer.getvalue(), path):
        with pytest.raises(AudioError, match="not a format xattn reads"):
            decode_audio(source)


def test_truncated_flac(jfk_path: Path) -> None:
    with pytest.raises(AudioError, match="cannot decode audio"):
        decode_audio(jfk_path.read_bytes()[:1000])


@settings(max_examples=60, deadline=None)
@given(
    prefix=st.sampled_from([b"", b"RIFF\x24\x00\x00\x00WAVEfmt ", b"fLaC", b"OggS", b"ID3\x03"]),
    tail=st.binary(max_size=600),
)
def test_garbage_raises_only_audio_error(prefix: bytes, tail: bytes) -> None:
    try:
        audio = decode_audio(prefix + tail)
    except AudioError:
        return
    check_audio(audio)  # whatever decodes must be valid audio


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="no such audio file"):
        decode_audio(tmp_path / "nope.wav")


def test_nan_samples() -> None:
    frames = np.zeros((1600, 1), np.float32)
    frames[[10, 20, 30], 0] = [np.nan, np.inf, -np.inf]
    with pytest.raises(AudioError, match="3 non-finite samples"):
        decode_audio(_encode(frames, SAMPLE_RATE, "WAV", "FLOAT"))


def test_zero_hz_header() -> None:
    with pytest.raises(AudioError, match="invalid sample rate 0 Hz"):
        decode_audio(_wav_header(0))
    assert len(decode_audio(_wav_header(SAMPLE_RATE))) == 1600  # the same header, 16 kHz


@pytest.mark.parametrize(
    ("audio", "problem"),
    [
        (np.zeros(0, np.float32), "empty"),
        (np.array([0.0, np.nan], np.float32), "1 non-finite"),
        (np.zeros(10, np.float64), "float32"),
        (np.zeros((2, 10), np.float32), "1-D"),
        ([0.0, 0.1], "numpy array"),
    ],
)
def test_check_audio(audio: np.ndarray, problem: str) -> None:
    with pytest.raises(AudioError, match=problem):
        check_audio(audio)


def test_check_audio_passes_good_audio() -> None:
    audio = np.zeros(10, np.float32)
    assert check_audio(audio) is audio


def test_max_seconds(jfk_path: Path, multilingual_path: Path) -> None:
    with pytest.raises(AudioTooLongError, match="too long"):
        decode_audio(jfk_path, max_seconds=5)
    with pytest.raises(AudioTooLongError, match="too long"):
        decode_audio(multilingual_path.read_bytes(), max_seconds=30)
    assert len(decode_audio(jfk_path, max_seconds=11.5)) == 11 * SAMPLE_RATE
    assert issubclass(AudioTooLongError, AudioError) and issubclass(AudioError, ValueError)


# --- raw PCM ----------------------------------------------------------------------------------


def test_pcm_int16_mono_exact() -> None:
    samples = np.array([0, 1, -1, 16384, -32768, 32767], "<i2")
    audio = pcm_to_audio(samples.tobytes(), SAMPLE_RATE, "int16", 1)
    np.testing.assert_array_equal(audio, samples.astype(np.float32) / 32768.0)


def test_pcm_float32_stereo_averages() -> None:
    frames = np.array([[0.5, 0.0], [0.25, 0.25], [-1.0, 1.0]], "<f4")
    audio = pcm_to_audio(frames.tobytes(), SAMPLE_RATE, "float32", 2)
    np.testing.assert_array_equal(audio, np.array([0.25, 0.25, 0.0], np.float32))


@pytest.mark.parametrize("rate", [8000, 44100, 48000, 44101])
def test_pcm_resamples(rate: int) -> None:
    pcm = (_tone(rate, 2) * 32767).astype("<i2").tobytes()
    audio = pcm_to_audio(pcm, rate, "int16", 2)
    assert abs(len(audio) - 2 * SAMPLE_RATE) <= 2
    assert abs(_peak_hz(audio) - 440.0) < 2.0


@settings(max_examples=40, deadline=None)
@given(
    rate=st.integers(1, 384_000),
    channels=st.integers(1, 4),
    samples=st.lists(st.integers(-32768, 32767), min_size=4, max_size=2000),
)
def test_pcm_any_rate(rate: int, channels: int, samples: list[int]) -> None:
    n = len(samples) // channels * channels
    pcm = np.array(samples[:n], "<i2").tobytes()
    audio = pcm_to_audio(pcm, rate, "int16", channels)
    expected = n // channels * SAMPLE_RATE / rate
    assert abs(len(audio) - expected) <= 1 + expected * 1e-3
    assert np.abs(audio).max() <= 1.0


@pytest.mark.parametrize(
    ("data", "rate", "encoding", "channels", "problem"),
    [
        (bytes(4), 0, "int16", 1, "invalid sample rate 0 Hz"),
        (bytes(4), -8000, "int16", 1, "invalid sample rate"),
        (bytes(4), 400_000, "int16", 1, "invalid sample rate"),
        (bytes(4), 16000, "int16", 0, "invalid channel count"),
        (bytes(4), 16000, "int16", 33, "invalid channel count"),
        (bytes(4), 16000, "mulaw", 1, "unknown PCM encoding"),
        (bytes(3), 16000, "int16", 1, "not a multiple of the frame size"),
        (bytes(6), 16000, "float32", 1, "not a multiple of the frame size"),
        (bytes(8), 16000, "int16", 3, "not a multiple of the frame size"),
        (b"", 16000, "int16", 1, "empty"),
        (np.array([np.nan], "<f4").tobytes(), 16000, "float32", 1, "1 non-finite"),
    ],
)
def test_pcm_bad_input(data: bytes, rate: int, encoding: str, channels: int, problem: str) -> None:
    with pytest.raises(AudioError, match=problem):
        pcm_to_audio(data, rate, encoding, channels)
