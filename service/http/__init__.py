"""The HTTP face of the server: OpenAI's audio API (transcriptions, translations, SSE
streaming, Realtime transcription over WebSocket) on the same Engine as gRPC, with the rows
as an opt-in extension. A thin translator: forms and events in, the gRPC path's calls
(service.engine.admit), OpenAI's shapes out; it owns no model and no decoding rules."""
