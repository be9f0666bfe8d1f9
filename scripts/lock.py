"""Write constraints.txt: the exact version of every package in the venv, for pip's `-c`.

    python scripts/lock.py           # rewrite constraints.txt from this environment
    python scripts/lock.py --check   # exit 1 if an installed version differs from the file

pyproject.toml states the ranges the code supports; constraints.txt pins what CI, `make` and
the Dockerfile install, so that all three run the same versions.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
SKIP = {"xattn", "pip", "setuptools", "wheel"}  # the project itself and the installer
HEADER = (
    "# Exact versions that CI, `make` and the Dockerfile install (pip -c constraints.txt).\n"
    "# pyproject.toml states the supported ranges. Regenerate with `make constraints`.\n"
)


def installed() -> dict[str, str]:
    """{canonical name: version} of every distribution in this environment but SKIP."""
    found = {}
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name not in SKIP:
            found[name] = dist.version
    return dict(sorted(found.items()))


def render(versions: dict[str, str]) -> str:
    # a local label (2.14.1+cpu) is dropped: the pin then admits the CPU and the default build
    lines = [f"{name}=={version.split('+')[0]}" for name, version in versions.items()]
    return HEADER + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = render(installed())
    if args.check:
        if LOCK.read_text() != text:
            sys.stderr.write("constraints.txt differs from this environment\n")
            return 1
        return 0
    LOCK.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
