"""Whole-file transcription: the sequential window loop as openai-whisper's transcribe()
(`sequential`), batched long-form windows (`batched`), vad_filter around either
(`vad_filter`), word and token timestamps (`words` over the pure functions of `alignment`),
and hallucination_silence_threshold (`hallucination`).

May import: xattn.model.audio, .net, .checkpoints, .decode.
"""
