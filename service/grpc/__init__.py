"""The gRPC face: xattn.v1.Transcriber on grpc.aio (servicer), TLS and bearer tokens
(security)."""
