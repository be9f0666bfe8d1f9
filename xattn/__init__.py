"""xattn's gRPC contract: generated stubs of proto/xattn/v1 (see scripts/gen_proto.py).

xattn/model, xattn/service and xattn/clients are links to the repository's top-level folders,
so that tools reading the source from the repository root (mypy, pyright, an editor) see the
package as installed; the install itself maps them (pyproject.toml's package-dir).
"""
