"""Generate the Python stubs of proto/xattn/v1/*.proto into the package `xattn.v1`.

    python scripts/gen_proto.py           # (re)write xattn/v1/*_pb2.py, *_pb2_grpc.py, *_pb2.pyi
    python scripts/gen_proto.py --check   # regenerate into a temp dir; exit 1 if the files differ

The protos are compiled with `-Iproto` and the output rooted at the repository, so the
modules are imported as `from xattn.v1 import transcriber_pb2` with no path tricks.
The output depends on the grpcio-tools version (it embeds the protobuf and grpc versions):
regenerate with the pinned one.
"""

from __future__ import annotations

import argparse
import filecmp
import logging
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

log = logging.getLogger("gen_proto")

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE_DIR = Path("xattn") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")


def proto_files() -> list[Path]:
    """The .proto files, relative to PROTO_ROOT, in a stable order."""
    return sorted(p.relative_to(PROTO_ROOT) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Compile every proto into `out_dir`; return the generated files relative to it."""
    protos = proto_files()
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT / PACKAGE_DIR}")
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(str(PROTO_ROOT / p) for p in protos),
    ]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    return generated_files(out_dir)


def generated_files(base: Path) -> list[Path]:
    """The generated stub files under `base`/xattn/v1, relative to `base`."""
    package = base / PACKAGE_DIR
    if not package.is_dir():
        return []
    return sorted(
        p.relative_to(base)
        for p in package.iterdir()
        if p.is_file() and p.name.endswith(GENERATED_SUFFIXES)
    )


def check() -> list[str]:
    """Problems between the committed stubs and freshly generated ones (empty: in sync)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        committed = generated_files(ROOT)
        problems = [f"missing: {p}" for p in fresh if p not in committed]
        problems += [f"stale (no proto generates it): {p}" for p in committed if p not in fresh]
        problems += [
            f"differs: {p}"
            for p in fresh
            if p in committed and not filecmp.cmp(Path(tmp) / p, ROOT / p, shallow=False)
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed stubs are out of date"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            log.error("%s", problem)
        if problems:
            log.error("stubs are out of date: run python scripts/gen_proto.py")
            return 1
        log.info("stubs are up to date")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))  # all or nothing: a failure leaves the stubs as they were
        for stale in generated_files(ROOT):
            if stale not in fresh:
                (ROOT / stale).unlink()
                log.info("removed %s", stale)
        (ROOT / PACKAGE_DIR).mkdir(parents=True, exist_ok=True)
        for path in fresh:
            shutil.copyfile(Path(tmp) / path, ROOT / path)
            log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
