"""Renderers of a transcription's cross-attention: terminal (rich), PNG (matplotlib), HTML."""
