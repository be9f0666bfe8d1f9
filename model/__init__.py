"""xattn's model: a Whisper encoder-decoder that shows its cross-attention.

Nothing in this package knows about gRPC, sockets or terminals. Its layers, one folder each,
in the order data flows through them; a layer imports only the layers above it in this list
(tests/test_imports.py checks it):

- `audio/`: files and PCM to 16 kHz samples, the log-mel, voice activity (Silero).
- `net/`: the network (encoder, decoder and its cached step, the KV cache, the linear kernels,
  the C++ step, the int8 output projection) and its dimensions.
- `checkpoints/`: openai-whisper, Hugging Face and CTranslate2 weights into the network.
- `decode/`: one window's decoding: the tokenizer, prompts, options, greedy and beam search,
  the step batcher, the results it hands out.
- `transcribe/`: whole files: the sequential (seek) and batched window loops, vad_filter,
  word timestamps, hallucination skipping.
- `live/`: live recognition of a stream as it is spoken, and its voice activity events.

`pipeline.py` (load a checkpoint and transcribe: `load_pipeline`) and `__main__.py` sit on top
and may import any layer.
"""
