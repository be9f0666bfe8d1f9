"""Live recognition: a stream transcribed as it is spoken (`transcriber`: LiveTranscriber),
and voice activity on the stream as speech begin/end events (`vad_stream`).

May import: xattn.model.audio, .net, .checkpoints, .decode, .transcribe.
"""
