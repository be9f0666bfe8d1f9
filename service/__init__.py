"""xattn's server, by faces over one engine.

engine/  the engine and its parts: admission, queue, decode workers, live sessions, the
         proto's requests into the model's options (convert, rows), the errors table, tokens
grpc/    the gRPC face (xattn.v1.Transcriber, its TLS and auth interceptor)
http/    the HTTP face: OpenAI's audio API, SSE, Realtime over WebSocket
top      the process: server (every face on one event loop), __main__ (flags), background

A face imports the engine and no other face; the engine imports no face (tests/test_imports).
"""
