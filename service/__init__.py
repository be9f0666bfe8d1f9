"""xattn's gRPC server: engine (model, queue, workers), convert, servicer, server."""
