"""The wheel: one import namespace (`xattn`), ranges in pyproject, exact versions in constraints.

The test builds the wheel (`pip wheel . --no-deps`), checks that its top-level entries are
`xattn/` and its dist-info only, installs it into a fresh venv (its dependencies borrowed from
this environment through a .pth line, so nothing is downloaded) and runs both console scripts
from a folder outside the repository.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w", out],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("xattn-*.whl")
    return found


def test_the_wheel_holds_only_the_xattn_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"xattn"}, sorted(top)
    for package in ("model", "service", "clients", "v1"):
        assert f"xattn/{package}/__init__.py" in names, package
    assert "xattn/clients/render/assets/inspector.html" in names  # package data


def test_a_fresh_venv_runs_both_console_scripts(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    bin_dir = env_dir / "bin"
    site = Path(
        subprocess.run(
            [bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            bin_dir / "python",
            "install",
            "--no-deps",
            "--no-index",
            wheel,
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # the dependencies: this environment's site-packages as a plain path (its .pth files, the
    # editable install of xattn among them, are not read from there)
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = subprocess.run(
        [bin_dir / "python", "-c", "import xattn.model, xattn.v1; print(xattn.model.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert Path(where.strip()).is_relative_to(site), where
    for script in ("xattn-server", "xattn"):
        done = subprocess.run(
            [bin_dir / script, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert "usage:" in done.stdout


def test_dependencies_are_ranges_and_constraints_pin_them() -> None:
    locked = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            locked[name] = version
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        assert not any(s.operator == "==" for s in req.specifier), f"{dep}: a range, not a pin"
        name = req.name.lower().replace("_", "-")
        assert name in locked, f"{name} is not pinned in constraints.txt"
        assert req.specifier.contains(locked[name], prereleases=True), (dep, locked[name])
