"""xattn's gRPC contract: generated stubs of proto/xattn/v1 (see scripts/gen_proto.py)."""
