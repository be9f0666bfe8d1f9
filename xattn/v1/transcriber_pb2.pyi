from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PcmEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PCM_ENCODING_UNSPECIFIED: _ClassVar[PcmEncoding]
    PCM_ENCODING_INT16: _ClassVar[PcmEncoding]
    PCM_ENCODING_FLOAT32: _ClassVar[PcmEncoding]

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_UNSPECIFIED: _ClassVar[Task]
    TASK_TRANSCRIBE: _ClassVar[Task]
    TASK_TRANSLATE: _ClassVar[Task]

class AlignmentMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALIGNMENT_MODE_UNSPECIFIED: _ClassVar[AlignmentMode]
    ALIGNMENT_MODE_NONE: _ClassVar[AlignmentMode]
    ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS: _ClassVar[AlignmentMode]
    ALIGNMENT_MODE_ALL_HEADS: _ClassVar[AlignmentMode]
    ALIGNMENT_MODE_HEADS: _ClassVar[AlignmentMode]

class DataType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_TYPE_UNSPECIFIED: _ClassVar[DataType]
    DATA_TYPE_FLOAT16: _ClassVar[DataType]
    DATA_TYPE_FLOAT32: _ClassVar[DataType]

class TokenKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOKEN_KIND_UNSPECIFIED: _ClassVar[TokenKind]
    TOKEN_KIND_TEXT: _ClassVar[TokenKind]
    TOKEN_KIND_TIMESTAMP: _ClassVar[TokenKind]
    TOKEN_KIND_END_OF_TEXT: _ClassVar[TokenKind]

class SpeechEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPEECH_EVENT_TYPE_UNSPECIFIED: _ClassVar[SpeechEventType]
    SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_BEGIN: _ClassVar[SpeechEventType]
    SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_END: _ClassVar[SpeechEventType]
    SPEECH_EVENT_TYPE_END_OF_SINGLE_UTTERANCE: _ClassVar[SpeechEventType]
PCM_ENCODING_UNSPECIFIED: PcmEncoding
PCM_ENCODING_INT16: PcmEncoding
PCM_ENCODING_FLOAT32: PcmEncoding
TASK_UNSPECIFIED: Task
TASK_TRANSCRIBE: Task
TASK_TRANSLATE: Task
ALIGNMENT_MODE_UNSPECIFIED: AlignmentMode
ALIGNMENT_MODE_NONE: AlignmentMode
ALIGNMENT_MODE_MEAN_ALIGNMENT_HEADS: AlignmentMode
ALIGNMENT_MODE_ALL_HEADS: AlignmentMode
ALIGNMENT_MODE_HEADS: AlignmentMode
DATA_TYPE_UNSPECIFIED: DataType
DATA_TYPE_FLOAT16: DataType
DATA_TYPE_FLOAT32: DataType
TOKEN_KIND_UNSPECIFIED: TokenKind
TOKEN_KIND_TEXT: TokenKind
TOKEN_KIND_TIMESTAMP: TokenKind
TOKEN_KIND_END_OF_TEXT: TokenKind
SPEECH_EVENT_TYPE_UNSPECIFIED: SpeechEventType
SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_BEGIN: SpeechEventType
SPEECH_EVENT_TYPE_SPEECH_ACTIVITY_END: SpeechEventType
SPEECH_EVENT_TYPE_END_OF_SINGLE_UTTERANCE: SpeechEventType

class GetModelInfoRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model_name", "dims", "alignment_heads", "languages", "multilingual", "alignment_frames_per_second", "limits", "compute_type", "device", "compute_exact", "compute_note", "models", "alignment_heads_source")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_HEADS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    MULTILINGUAL_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FRAMES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_EXACT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NOTE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_HEADS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    dims: ModelDims
    alignment_heads: _containers.RepeatedCompositeFieldContainer[AttentionHead]
    languages: _containers.RepeatedScalarFieldContainer[str]
    multilingual: bool
    alignment_frames_per_second: int
    limits: ServerLimits
    compute_type: str
    device: str
    compute_exact: bool
    compute_note: str
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    alignment_heads_source: str
    def __init__(self, model_name: _Optional[str] = ..., dims: _Optional[_Union[ModelDims, _Mapping]] = ..., alignment_heads: _Optional[_Iterable[_Union[AttentionHead, _Mapping]]] = ..., languages: _Optional[_Iterable[str]] = ..., multilingual: _Optional[bool] = ..., alignment_frames_per_second: _Optional[int] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., compute_type: _Optional[str] = ..., device: _Optional[str] = ..., compute_exact: _Optional[bool] = ..., compute_note: _Optional[str] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., alignment_heads_source: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_name", "dims", "alignment_heads", "alignment_heads_source", "languages", "multilingual", "compute_type", "device", "compute_exact", "compute_note", "checkpoint_format", "checkpoint_dtype", "limits")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_HEADS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_HEADS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    MULTILINGUAL_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_EXACT_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NOTE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FORMAT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    dims: ModelDims
    alignment_heads: _containers.RepeatedCompositeFieldContainer[AttentionHead]
    alignment_heads_source: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    multilingual: bool
    compute_type: str
    device: str
    compute_exact: bool
    compute_note: str
    checkpoint_format: str
    checkpoint_dtype: str
    limits: ServerLimits
    def __init__(self, model_name: _Optional[str] = ..., dims: _Optional[_Union[ModelDims, _Mapping]] = ..., alignment_heads: _Optional[_Iterable[_Union[AttentionHead, _Mapping]]] = ..., alignment_heads_source: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ..., multilingual: _Optional[bool] = ..., compute_type: _Optional[str] = ..., device: _Optional[str] = ..., compute_exact: _Optional[bool] = ..., compute_note: _Optional[str] = ..., checkpoint_format: _Optional[str] = ..., checkpoint_dtype: _Optional[str] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ...) -> None: ...

class ModelDims(_message.Message):
    __slots__ = ("n_mels", "n_audio_ctx", "n_audio_state", "n_audio_head", "n_audio_layer", "n_vocab", "n_text_ctx", "n_text_state", "n_text_head", "n_text_layer")
    N_MELS_FIELD_NUMBER: _ClassVar[int]
    N_AUDIO_CTX_FIELD_NUMBER: _ClassVar[int]
    N_AUDIO_STATE_FIELD_NUMBER: _ClassVar[int]
    N_AUDIO_HEAD_FIELD_NUMBER: _ClassVar[int]
    N_AUDIO_LAYER_FIELD_NUMBER: _ClassVar[int]
    N_VOCAB_FIELD_NUMBER: _ClassVar[int]
    N_TEXT_CTX_FIELD_NUMBER: _ClassVar[int]
    N_TEXT_STATE_FIELD_NUMBER: _ClassVar[int]
    N_TEXT_HEAD_FIELD_NUMBER: _ClassVar[int]
    N_TEXT_LAYER_FIELD_NUMBER: _ClassVar[int]
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int
    def __init__(self, n_mels: _Optional[int] = ..., n_audio_ctx: _Optional[int] = ..., n_audio_state: _Optional[int] = ..., n_audio_head: _Optional[int] = ..., n_audio_layer: _Optional[int] = ..., n_vocab: _Optional[int] = ..., n_text_ctx: _Optional[int] = ..., n_text_state: _Optional[int] = ..., n_text_head: _Optional[int] = ..., n_text_layer: _Optional[int] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_audio_seconds", "max_receive_message_bytes", "max_send_message_bytes", "workers", "max_queue", "max_live_seconds", "live_idle_timeout_seconds", "max_live_streams", "live_lag_target_seconds", "live_compute", "live_beam_size")
    MAX_AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_SEND_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_LIVE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_IDLE_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_LIVE_STREAMS_FIELD_NUMBER: _ClassVar[int]
    LIVE_LAG_TARGET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LIVE_COMPUTE_FIELD_NUMBER: _ClassVar[int]
    LIVE_BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    max_audio_seconds: float
    max_receive_message_bytes: int
    max_send_message_bytes: int
    workers: int
    max_queue: int
    max_live_seconds: float
    live_idle_timeout_seconds: float
    max_live_streams: int
    live_lag_target_seconds: float
    live_compute: str
    live_beam_size: int
    def __init__(self, max_audio_seconds: _Optional[float] = ..., max_receive_message_bytes: _Optional[int] = ..., max_send_message_bytes: _Optional[int] = ..., workers: _Optional[int] = ..., max_queue: _Optional[int] = ..., max_live_seconds: _Optional[float] = ..., live_idle_timeout_seconds: _Optional[float] = ..., max_live_streams: _Optional[int] = ..., live_lag_target_seconds: _Optional[float] = ..., live_compute: _Optional[str] = ..., live_beam_size: _Optional[int] = ...) -> None: ...

class AttentionHead(_message.Message):
    __slots__ = ("layer", "head")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    layer: int
    head: int
    def __init__(self, layer: _Optional[int] = ..., head: _Optional[int] = ...) -> None: ...

class TranscribeRequest(_message.Message):
    __slots__ = ("audio", "options", "alignment", "model")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    audio: Audio
    options: TranscriptionOptions
    alignment: AlignmentOptions
    model: str
    def __init__(self, audio: _Optional[_Union[Audio, _Mapping]] = ..., options: _Optional[_Union[TranscriptionOptions, _Mapping]] = ..., alignment: _Optional[_Union[AlignmentOptions, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class TranscribeResponse(_message.Message):
    __slots__ = ("transcript", "windows", "timings")
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    transcript: Transcript
    windows: _containers.RepeatedCompositeFieldContainer[WindowAlignment]
    timings: Timings
    def __init__(self, transcript: _Optional[_Union[Transcript, _Mapping]] = ..., windows: _Optional[_Iterable[_Union[WindowAlignment, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class StreamTranscribeRequest(_message.Message):
    __slots__ = ("audio", "options", "alignment", "model")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    audio: Audio
    options: TranscriptionOptions
    alignment: AlignmentOptions
    model: str
    def __init__(self, audio: _Optional[_Union[Audio, _Mapping]] = ..., options: _Optional[_Union[TranscriptionOptions, _Mapping]] = ..., alignment: _Optional[_Union[AlignmentOptions, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class StreamTranscribeResponse(_message.Message):
    __slots__ = ("window_start", "token", "window_discarded", "segment", "done")
    WINDOW_START_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_DISCARDED_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    window_start: WindowStart
    token: Token
    window_discarded: WindowDiscarded
    segment: Segment
    done: Done
    def __init__(self, window_start: _Optional[_Union[WindowStart, _Mapping]] = ..., token: _Optional[_Union[Token, _Mapping]] = ..., window_discarded: _Optional[_Union[WindowDiscarded, _Mapping]] = ..., segment: _Optional[_Union[Segment, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class Audio(_message.Message):
    __slots__ = ("encoded", "pcm")
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    PCM_FIELD_NUMBER: _ClassVar[int]
    encoded: bytes
    pcm: Pcm
    def __init__(self, encoded: _Optional[bytes] = ..., pcm: _Optional[_Union[Pcm, _Mapping]] = ...) -> None: ...

class Pcm(_message.Message):
    __slots__ = ("data", "sample_rate", "encoding", "channels")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sample_rate: int
    encoding: PcmEncoding
    channels: int
    def __init__(self, data: _Optional[bytes] = ..., sample_rate: _Optional[int] = ..., encoding: _Optional[_Union[PcmEncoding, str]] = ..., channels: _Optional[int] = ...) -> None: ...

class TranscriptionOptions(_message.Message):
    __slots__ = ("language", "task", "word_timestamps", "temperatures", "condition_on_previous_text", "beam_size", "best_of", "patience", "length_penalty", "initial_prompt", "prefix", "hotwords", "suppress_tokens", "suppress_blank", "without_timestamps", "max_initial_timestamp", "compression_ratio_threshold", "logprob_threshold", "no_speech_threshold", "hallucination_silence_threshold", "clip_timestamps", "prepend_punctuations", "append_punctuations", "vad_filter", "vad_options", "batch_size")
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURES_FIELD_NUMBER: _ClassVar[int]
    CONDITION_ON_PREVIOUS_TEXT_FIELD_NUMBER: _ClassVar[int]
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    BEST_OF_FIELD_NUMBER: _ClassVar[int]
    PATIENCE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PROMPT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    SUPPRESS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUPPRESS_BLANK_FIELD_NUMBER: _ClassVar[int]
    WITHOUT_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    MAX_INITIAL_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    NO_SPEECH_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    HALLUCINATION_SILENCE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CLIP_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    PREPEND_PUNCTUATIONS_FIELD_NUMBER: _ClassVar[int]
    APPEND_PUNCTUATIONS_FIELD_NUMBER: _ClassVar[int]
    VAD_FILTER_FIELD_NUMBER: _ClassVar[int]
    VAD_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    language: str
    task: Task
    word_timestamps: bool
    temperatures: _containers.RepeatedScalarFieldContainer[float]
    condition_on_previous_text: bool
    beam_size: int
    best_of: int
    patience: float
    length_penalty: float
    initial_prompt: str
    prefix: str
    hotwords: str
    suppress_tokens: TokenIds
    suppress_blank: bool
    without_timestamps: bool
    max_initial_timestamp: float
    compression_ratio_threshold: Threshold
    logprob_threshold: Threshold
    no_speech_threshold: Threshold
    hallucination_silence_threshold: float
    clip_timestamps: _containers.RepeatedScalarFieldContainer[float]
    prepend_punctuations: str
    append_punctuations: str
    vad_filter: bool
    vad_options: VadOptions
    batch_size: int
    def __init__(self, language: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., word_timestamps: _Optional[bool] = ..., temperatures: _Optional[_Iterable[float]] = ..., condition_on_previous_text: _Optional[bool] = ..., beam_size: _Optional[int] = ..., best_of: _Optional[int] = ..., patience: _Optional[float] = ..., length_penalty: _Optional[float] = ..., initial_prompt: _Optional[str] = ..., prefix: _Optional[str] = ..., hotwords: _Optional[str] = ..., suppress_tokens: _Optional[_Union[TokenIds, _Mapping]] = ..., suppress_blank: _Optional[bool] = ..., without_timestamps: _Optional[bool] = ..., max_initial_timestamp: _Optional[float] = ..., compression_ratio_threshold: _Optional[_Union[Threshold, _Mapping]] = ..., logprob_threshold: _Optional[_Union[Threshold, _Mapping]] = ..., no_speech_threshold: _Optional[_Union[Threshold, _Mapping]] = ..., hallucination_silence_threshold: _Optional[float] = ..., clip_timestamps: _Optional[_Iterable[float]] = ..., prepend_punctuations: _Optional[str] = ..., append_punctuations: _Optional[str] = ..., vad_filter: _Optional[bool] = ..., vad_options: _Optional[_Union[VadOptions, _Mapping]] = ..., batch_size: _Optional[int] = ...) -> None: ...

class VadOptions(_message.Message):
    __slots__ = ("threshold", "neg_threshold", "min_speech_duration_ms", "max_speech_duration_s", "min_silence_duration_ms", "speech_pad_ms")
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    NEG_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    MIN_SPEECH_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_SPEECH_DURATION_S_FIELD_NUMBER: _ClassVar[int]
    MIN_SILENCE_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    SPEECH_PAD_MS_FIELD_NUMBER: _ClassVar[int]
    threshold: float
    neg_threshold: float
    min_speech_duration_ms: int
    max_speech_duration_s: float
    min_silence_duration_ms: int
    speech_pad_ms: int
    def __init__(self, threshold: _Optional[float] = ..., neg_threshold: _Optional[float] = ..., min_speech_duration_ms: _Optional[int] = ..., max_speech_duration_s: _Optional[float] = ..., min_silence_duration_ms: _Optional[int] = ..., speech_pad_ms: _Optional[int] = ...) -> None: ...

class TimeSpan(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ...) -> None: ...

class FrameSpan(_message.Message):
    __slots__ = ("first_frame", "num_frames", "start")
    FIRST_FRAME_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    first_frame: int
    num_frames: int
    start: float
    def __init__(self, first_frame: _Optional[int] = ..., num_frames: _Optional[int] = ..., start: _Optional[float] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class Threshold(_message.Message):
    __slots__ = ("value", "off")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    OFF_FIELD_NUMBER: _ClassVar[int]
    value: float
    off: bool
    def __init__(self, value: _Optional[float] = ..., off: _Optional[bool] = ...) -> None: ...

class AlignmentOptions(_message.Message):
    __slots__ = ("mode", "heads", "data_type")
    MODE_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    mode: AlignmentMode
    heads: _containers.RepeatedCompositeFieldContainer[AttentionHead]
    data_type: DataType
    def __init__(self, mode: _Optional[_Union[AlignmentMode, str]] = ..., heads: _Optional[_Iterable[_Union[AttentionHead, _Mapping]]] = ..., data_type: _Optional[_Union[DataType, str]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "data_type", "data")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    data_type: DataType
    data: bytes
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., data_type: _Optional[_Union[DataType, str]] = ..., data: _Optional[bytes] = ...) -> None: ...

class WindowStart(_message.Message):
    __slots__ = ("window", "offset", "num_frames", "language", "clock")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    window: int
    offset: float
    num_frames: int
    language: str
    clock: _containers.RepeatedCompositeFieldContainer[FrameSpan]
    def __init__(self, window: _Optional[int] = ..., offset: _Optional[float] = ..., num_frames: _Optional[int] = ..., language: _Optional[str] = ..., clock: _Optional[_Iterable[_Union[FrameSpan, _Mapping]]] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("index", "id", "text", "logprob", "window", "temperature", "kind", "timestamp", "alignment", "early")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    EARLY_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: int
    text: str
    logprob: float
    window: int
    temperature: float
    kind: TokenKind
    timestamp: float
    alignment: Tensor
    early: bool
    def __init__(self, index: _Optional[int] = ..., id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ..., window: _Optional[int] = ..., temperature: _Optional[float] = ..., kind: _Optional[_Union[TokenKind, str]] = ..., timestamp: _Optional[float] = ..., alignment: _Optional[_Union[Tensor, _Mapping]] = ..., early: _Optional[bool] = ...) -> None: ...

class WindowDiscarded(_message.Message):
    __slots__ = ("window", "temperature", "reason")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    window: int
    temperature: float
    reason: str
    def __init__(self, window: _Optional[int] = ..., temperature: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class Word(_message.Message):
    __slots__ = ("word", "start", "end", "probability")
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    word: str
    start: float
    end: float
    probability: float
    def __init__(self, word: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., probability: _Optional[float] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("id", "window", "start", "end", "text", "tokens", "temperature", "avg_logprob", "compression_ratio", "no_speech_prob", "words", "seek")
    ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    AVG_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_FIELD_NUMBER: _ClassVar[int]
    NO_SPEECH_PROB_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    SEEK_FIELD_NUMBER: _ClassVar[int]
    id: int
    window: int
    start: float
    end: float
    text: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: _containers.RepeatedCompositeFieldContainer[Word]
    seek: int
    def __init__(self, id: _Optional[int] = ..., window: _Optional[int] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., text: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., temperature: _Optional[float] = ..., avg_logprob: _Optional[float] = ..., compression_ratio: _Optional[float] = ..., no_speech_prob: _Optional[float] = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ..., seek: _Optional[int] = ...) -> None: ...

class Transcript(_message.Message):
    __slots__ = ("text", "language", "segments", "duration", "speech", "vad_filtered")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    SPEECH_FIELD_NUMBER: _ClassVar[int]
    VAD_FILTERED_FIELD_NUMBER: _ClassVar[int]
    text: str
    language: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    duration: float
    speech: _containers.RepeatedCompositeFieldContainer[TimeSpan]
    vad_filtered: bool
    def __init__(self, text: _Optional[str] = ..., language: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., duration: _Optional[float] = ..., speech: _Optional[_Iterable[_Union[TimeSpan, _Mapping]]] = ..., vad_filtered: _Optional[bool] = ...) -> None: ...

class WindowAlignment(_message.Message):
    __slots__ = ("window", "offset", "num_frames", "token_indices", "token_ids", "matrix")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_INDICES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MATRIX_FIELD_NUMBER: _ClassVar[int]
    window: int
    offset: float
    num_frames: int
    token_indices: _containers.RepeatedScalarFieldContainer[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    matrix: Tensor
    def __init__(self, window: _Optional[int] = ..., offset: _Optional[float] = ..., num_frames: _Optional[int] = ..., token_indices: _Optional[_Iterable[int]] = ..., token_ids: _Optional[_Iterable[int]] = ..., matrix: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_seconds", "audio_seconds", "encode_seconds", "decode_seconds", "total_seconds")
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENCODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DECODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    queue_seconds: float
    audio_seconds: float
    encode_seconds: float
    decode_seconds: float
    total_seconds: float
    def __init__(self, queue_seconds: _Optional[float] = ..., audio_seconds: _Optional[float] = ..., encode_seconds: _Optional[float] = ..., decode_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("transcript", "timings")
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    transcript: Transcript
    timings: Timings
    def __init__(self, transcript: _Optional[_Union[Transcript, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class StreamingRecognizeRequest(_message.Message):
    __slots__ = ("config", "audio_content")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_CONTENT_FIELD_NUMBER: _ClassVar[int]
    config: StreamingRecognitionConfig
    audio_content: bytes
    def __init__(self, config: _Optional[_Union[StreamingRecognitionConfig, _Mapping]] = ..., audio_content: _Optional[bytes] = ...) -> None: ...

class StreamingRecognitionConfig(_message.Message):
    __slots__ = ("encoding", "sample_rate", "channels", "language", "interim_results", "alignment", "policy", "vad", "single_utterance", "vad_options", "model")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    INTERIM_RESULTS_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VAD_FIELD_NUMBER: _ClassVar[int]
    SINGLE_UTTERANCE_FIELD_NUMBER: _ClassVar[int]
    VAD_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    encoding: PcmEncoding
    sample_rate: int
    channels: int
    language: str
    interim_results: bool
    alignment: AlignmentOptions
    policy: LivePolicy
    vad: bool
    single_utterance: bool
    vad_options: VadOptions
    model: str
    def __init__(self, encoding: _Optional[_Union[PcmEncoding, str]] = ..., sample_rate: _Optional[int] = ..., channels: _Optional[int] = ..., language: _Optional[str] = ..., interim_results: _Optional[bool] = ..., alignment: _Optional[_Union[AlignmentOptions, _Mapping]] = ..., policy: _Optional[_Union[LivePolicy, _Mapping]] = ..., vad: _Optional[bool] = ..., single_utterance: _Optional[bool] = ..., vad_options: _Optional[_Union[VadOptions, _Mapping]] = ..., model: _Optional[str] = ...) -> None: ...

class LivePolicy(_message.Message):
    __slots__ = ("commit_margin", "agreement", "first_context", "beam_size")
    COMMIT_MARGIN_FIELD_NUMBER: _ClassVar[int]
    AGREEMENT_FIELD_NUMBER: _ClassVar[int]
    FIRST_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    commit_margin: float
    agreement: bool
    first_context: float
    beam_size: int
    def __init__(self, commit_margin: _Optional[float] = ..., agreement: _Optional[bool] = ..., first_context: _Optional[float] = ..., beam_size: _Optional[int] = ...) -> None: ...

class StreamingRecognizeResponse(_message.Message):
    __slots__ = ("result", "done", "speech_event")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    SPEECH_EVENT_FIELD_NUMBER: _ClassVar[int]
    result: StreamingRecognitionResult
    done: StreamingRecognizeDone
    speech_event: SpeechEvent
    def __init__(self, result: _Optional[_Union[StreamingRecognitionResult, _Mapping]] = ..., done: _Optional[_Union[StreamingRecognizeDone, _Mapping]] = ..., speech_event: _Optional[_Union[SpeechEvent, _Mapping]] = ...) -> None: ...

class SpeechEvent(_message.Message):
    __slots__ = ("type", "time")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    type: SpeechEventType
    time: float
    def __init__(self, type: _Optional[_Union[SpeechEventType, str]] = ..., time: _Optional[float] = ...) -> None: ...

class StreamingRecognitionResult(_message.Message):
    __slots__ = ("is_final", "stability", "text", "tokens", "words", "buffer_offset", "audio_seconds")
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    STABILITY_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    BUFFER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    is_final: bool
    stability: float
    text: str
    tokens: _containers.RepeatedCompositeFieldContainer[StreamingToken]
    words: _containers.RepeatedCompositeFieldContainer[Word]
    buffer_offset: float
    audio_seconds: float
    def __init__(self, is_final: _Optional[bool] = ..., stability: _Optional[float] = ..., text: _Optional[str] = ..., tokens: _Optional[_Iterable[_Union[StreamingToken, _Mapping]]] = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ..., buffer_offset: _Optional[float] = ..., audio_seconds: _Optional[float] = ...) -> None: ...

class StreamingToken(_message.Message):
    __slots__ = ("index", "id", "text", "logprob", "peak_time", "alignment")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    PEAK_TIME_FIELD_NUMBER: _ClassVar[int]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: int
    text: str
    logprob: float
    peak_time: float
    alignment: Tensor
    def __init__(self, index: _Optional[int] = ..., id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ..., peak_time: _Optional[float] = ..., alignment: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class StreamingRecognizeDone(_message.Message):
    __slots__ = ("text", "language", "audio_seconds", "final_results", "tokens", "decode_steps", "encode_seconds", "compute_seconds", "total_seconds", "speech_seconds", "skipped_decode_steps", "encoder_frames", "decoder_steps")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    AUDIO_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FINAL_RESULTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    ENCODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SPEECH_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    ENCODER_FRAMES_FIELD_NUMBER: _ClassVar[int]
    DECODER_STEPS_FIELD_NUMBER: _ClassVar[int]
    text: str
    language: str
    audio_seconds: float
    final_results: int
    tokens: int
    decode_steps: int
    encode_seconds: float
    compute_seconds: float
    total_seconds: float
    speech_seconds: float
    skipped_decode_steps: int
    encoder_frames: int
    decoder_steps: int
    def __init__(self, text: _Optional[str] = ..., language: _Optional[str] = ..., audio_seconds: _Optional[float] = ..., final_results: _Optional[int] = ..., tokens: _Optional[int] = ..., decode_steps: _Optional[int] = ..., encode_seconds: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ..., speech_seconds: _Optional[float] = ..., skipped_decode_steps: _Optional[int] = ..., encoder_frames: _Optional[int] = ..., decoder_steps: _Optional[int] = ...) -> None: ...
