"""CPU builds of torch and torchaudio for the image where PyTorch's CPU index
(https://download.pytorch.org/whl/cpu, the Dockerfile's TORCH_INDEX_URL) is out of reach:
deploy/compose_check.sh runs it there, and passes what it prints to the build.

    python deploy/torch_wheels.py deploy/wheels     # prints KEY=VALUE build arguments

- torch: a CPU build for CPython 3.11 on this machine, XATTN_TORCH_WHEEL or the newest
  `torch-*+cpu-cp311-*` in pip's find-links folders, linked into the folder; TORCH_VERSION
  is its version (it replaces constraints.txt's pin in the build when they differ);
- torchaudio: constraints.txt's release from PyPI, whose Linux wheels link CUDA (libcudart,
  libtorch_cuda: they do not load beside a CPU torch), rewritten without its C++ extension
  (torchaudio/lib/*.so) as VERSION+noext. torchaudio supports running without it
  (_IS_TORCHAUDIO_EXT_AVAILABLE is then False), and what xattn uses of torchaudio
  (functional.resample, melscale_fbanks, the sinc kernel) is Python on torch's ops. pip takes
  it over PyPI's wheel: a local version sorts higher, and the pin torchaudio==X admits X+noext.
Everything else comes from PyPI (TORCH_INDEX_URL=https://pypi.org/simple).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCAL = "noext"


def pinned(name: str) -> str:
    text = (ROOT / "constraints.txt").read_text()
    found = re.search(rf"^{name}==(\S+)$", text, re.M)
    if found is None:
        raise SystemExit(f"torch_wheels: no {name}== in constraints.txt")
    return found[1]


def find_torch() -> Path:
    named = os.environ.get("XATTN_TORCH_WHEEL")
    if named:
        return Path(named)
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    folders = [
        f
        for line in listed.splitlines()
        if "find-links" in line
        for f in line.split("=", 1)[1].strip("'\" ").split()
    ]
    wheels = [w for f in folders for w in Path(f).glob("torch-*+cpu-cp311-cp311-*linux*.whl")]
    if not wheels:
        raise SystemExit(
            "torch_wheels: PyTorch's CPU index is out of reach and no CPU torch wheel is on "
            "this machine: set XATTN_TORCH_WHEEL=/path/to/torch-VERSION+cpu-cp311-...whl"
        )
    return max(wheels, key=lambda w: [int(n) for n in re.findall(r"\d+", w.name.split("-")[1])])


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def without_extension(wheel: Path, folder: Path) -> Path:
    """`wheel` (torchaudio) without torchaudio/lib/*.so, as version VERSION+noext."""
    name, version, *tags = wheel.name[: -len(".whl")].split("-")
    local = f"{version}+{LOCAL}"
    old_info, new_info = f"{name}-{version}.dist-info", f"{name}-{local}.dist-info"
    target = folder / ("-".join([name, local, *tags]) + ".whl")
    records = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            path = item.filename
            if re.fullmatch(rf"{name}/lib/[^/]+\.so(\.\d+)*", path) or path.endswith("/RECORD"):
                continue
            data = src.read(item)
            path = path.replace(old_info, new_info, 1)
            if path == f"{new_info}/METADATA":
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {local}".encode(), data, count=1)
            dst.writestr(zipfile.ZipInfo(path, item.date_time), data, zipfile.ZIP_DEFLATED)
            records.append(record_line(path, data))
            stamp = item.date_time
        records.append(f"{new_info}/RECORD,,")
        record = zipfile.ZipInfo(f"{new_info}/RECORD", stamp)  # the same bytes every time
        dst.writestr(record, "\n".join(records) + "\n", zipfile.ZIP_DEFLATED)
    return target


def torchaudio_wheel(version: str, folder: Path) -> Path:
    """PyPI's torchaudio `version` without its extension, in `folder` (made once)."""
    made = sorted(folder.glob(f"torchaudio-{version}+{LOCAL}-*.whl"))
    if made:
        return made[0]
    with tempfile.TemporaryDirectory() as tmp:
        download = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        download += ["--only-binary=:all:", "--python-version", "3.11"]
        download += ["--platform", "manylinux_2_28_x86_64", "-d", tmp]
        subprocess.run([*download, f"torchaudio=={version}"], check=True)
        (downloaded,) = Path(tmp).glob("torchaudio-*.whl")
        return without_extension(downloaded, folder)


def main() -> int:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "deploy" / "wheels")
    torch, audio_version = find_torch(), pinned("torchaudio")
    keep = (torch.name, f"torchaudio-{audio_version}+{LOCAL}-")
    for old in [*folder.glob("torch-*.whl"), *folder.glob("torchaudio-*.whl")]:
        if not old.name.startswith(keep):
            old.unlink()
    if not (folder / torch.name).exists():
        try:
            os.link(torch, folder / torch.name)
        except OSError:
            (folder / torch.name).write_bytes(torch.read_bytes())
    audio = torchaudio_wheel(audio_version, folder)
    torch_version = torch.name.split("-")[1]
    print(
        f"torch {torch_version} from {torch}; {audio.name} (PyPI's, without its CUDA-linked "
        "extension)",
        file=sys.stderr,
    )
    print("TORCH_INDEX_URL=https://pypi.org/simple")
    print(f"TORCH_VERSION={torch_version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
