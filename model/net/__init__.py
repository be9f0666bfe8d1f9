"""The network: Whisper's encoder and decoder (`whisper`), their dimensions (`dims`), the
decoder's KV cache (`kv_cache`), the step's linear kernels (`linear`), the C++ decoder step
(`fused`, built from `csrc/`) and the int8 output projection (`logits`).

May import: xattn.model.audio (it imports none of it today); nothing above.
"""
