"""xattn's model: a Whisper encoder-decoder that shows its cross-attention.

Nothing in this package knows about gRPC, sockets or terminals.
"""
