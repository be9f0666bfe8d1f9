"""A compose project driven the way a user drives it, for tests/test_compose_stack.py.

`Tools` is the container engine (docker or podman) and its compose tool (`docker compose`,
`docker-compose`, `podman-compose`), as deploy/compose_check.sh chose them (XATTN_CHECK_ENGINE,
XATTN_CHECK_COMPOSE) or found here. `Stack` is one compose project of the repository's
docker-compose.yml (plus overrides) under its own name, on free loopback ports, with its own
out/ folder: `compose up`, the containers' health, exit codes and logs, `compose down`.

Podman without systemd (this sandbox, many CI runners) schedules no health checks, so while
a Stack waits for health it runs `podman healthcheck run` itself: the compose file's own
check, as systemd's timer would run it. podman-compose before podman 4.6 does not wait for
`condition: service_healthy`; `Stack.start` then starts the dependents itself once their
dependencies are healthy, which is what Docker's compose does.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from benchmarks.replicas import free_port

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
IMAGE = "xattn:local"
CHECK_STATE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / (
    "xattn-compose-check"
)
PORTS = (
    "XATTN_PORT",
    "XATTN_HTTP_PORT",
    "XATTN_INSPECTOR_PORT",
    "XATTN_LB_PORT",
    "XATTN_LB_HTTP_PORT",
    "XATTN_LB_STATS_PORT",
    "XATTN_WYOMING_PORT",
    "XATTN_PROMETHEUS_PORT",
    "XATTN_GRAFANA_PORT",
)


@dataclass(frozen=True)
class Tools:
    engine: str  # "docker" or "podman"
    compose: tuple[str, ...]
    env: dict[str, str]  # what the engine needs (podman: CONTAINERS_CONF)
    version: tuple[int, ...]  # the engine's

    @property
    def orders_by_health(self) -> bool:
        """Whether `compose up` itself waits for `condition: service_healthy`."""
        return self.engine == "docker" or self.version >= (4, 6)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.engine, *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def find_tools() -> Tools | str:
    """The engine and compose tool to use, or a sentence naming what is missing."""
    engine = os.environ.get("XATTN_CHECK_ENGINE")
    if engine is None:
        if shutil.which("docker") and _ok(["docker", "info"]):
            engine = "docker"
        elif shutil.which("podman"):
            engine = "podman"
        else:
            return "no container engine (a Docker daemon, or podman: apt-get install podman)"
    env: dict[str, str] = {}
    if engine == "podman":
        conf = os.environ.get("CONTAINERS_CONF") or str(CHECK_STATE / "containers.conf")
        if Path(conf).is_file():
            env["CONTAINERS_CONF"] = conf
    named = os.environ.get("XATTN_CHECK_COMPOSE")
    if named:
        compose = tuple(shlex.split(named))
    elif engine == "docker" and _ok(["docker", "compose", "version"]):
        compose = ("docker", "compose")
    else:
        tool = "docker-compose" if engine == "docker" else "podman-compose"
        found = shutil.which(tool) or shutil.which(tool, path=str(CHECK_STATE / "venv" / "bin"))
        if found is None:
            return f"no compose tool for {engine} ({tool}; `make compose-check` installs one)"
        compose = (found,)
    version = Tools(engine, compose, env, ()).run("version", "--format", "{{.Client.Version}}")
    if version.returncode != 0:
        return f"{engine} does not answer: {version.stderr.strip()}"
    numbers = tuple(int(n) for n in version.stdout.strip().split("-")[0].split(".")[:3])
    tools = Tools(engine, compose, env, numbers)
    if tools.run("image", "inspect", IMAGE).returncode != 0:
        return f"no image {IMAGE} in {engine} (`make compose-check` builds it)"
    return tools


def _ok(command: list[str]) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def container_user() -> tuple[int, int]:
    """Who the containers run as (XATTN_UID, XATTN_GID), as the README says to set them: you;
    as root, the image's own user (1000), and the check hands it its folders."""
    if os.geteuid() == 0:
        return 1000, 1000
    return os.geteuid(), os.getegid()


def hand_over(path: Path) -> None:
    """Make `path` (a folder, and what is in it) the containers' user's, as root; a user
    running the containers as themselves owns it already."""
    if os.geteuid() == 0:
        uid, gid = container_user()
        for p in [path, *path.rglob("*")]:
            os.chown(p, uid, gid)


@dataclass(frozen=True)
class Stack:
    """One compose project: its name, files, profiles and environment (XATTN_* settings)."""

    tools: Tools
    project: str
    env: dict[str, str]
    files: tuple[Path, ...] = (COMPOSE_FILE,)
    profiles: tuple[str, ...] = ()
    log: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def new(cls, tools: Tools, name: str, out: Path, **env: str) -> Stack:
        uid, gid = container_user()
        settings = {port: str(free_port()) for port in PORTS}
        settings |= {"XATTN_OUT": str(out), "XATTN_UID": str(uid), "XATTN_GID": str(gid)}
        return cls(tools, f"xattn-check-{name}-{os.getpid()}", settings | env)

    def with_(self, *files: Path, profiles: Sequence[str] = (), **env: str) -> Stack:
        """The same project with more compose files, profiles or settings."""
        return replace(
            self,
            files=self.files + files,
            profiles=self.profiles + tuple(profiles),
            env=self.env | env,
        )

    def port(self, name: str) -> int:
        return int(self.env[name])

    def compose_command(self, *args: str) -> list[str]:
        command = [*self.tools.compose, "-p", self.project]
        for f in self.files:
            command += ["-f", str(f)]
        for profile in self.profiles:
            command += ["--profile", profile]
        return [*command, *args]

    def compose_env(self) -> dict[str, str]:
        outside = {k: v for k, v in os.environ.items() if not k.startswith("XATTN_")}
        return outside | self.tools.env | self.env

    def compose(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `compose ARGS` to its end (driving health checks meanwhile, see `start`)."""
        command = self.compose_command(*args)
        self.log.append(shlex.join(command))
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=self.compose_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            self.drive_health()
            if time.monotonic() > deadline:
                proc.kill()
                break
            try:
                proc.wait(1)
            except subprocess.TimeoutExpired:
                pass
        out = proc.communicate()[0]
        done = subprocess.CompletedProcess(command, proc.returncode, out, "")
        assert not check or done.returncode == 0, f"{shlex.join(command)}:\n{out[-3000:]}"
        return done

    # --- containers ---------------------------------------------------------------------------

    def containers(self, service: str | None = None, running: bool = False) -> list[str]:
        """IDs of the project's containers (of `service`), in their compose number order."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        done = self.tools.run("ps", "-q", "--no-trunc", *([] if running else ["-a"]), *filters)
        assert done.returncode == 0, done.stderr
        ids = done.stdout.split()
        if not ids:
            return []
        inspected = self.tools.run("inspect", *ids)
        assert inspected.returncode == 0, inspected.stderr

        def number(c: dict) -> int:
            labels = c["Config"].get("Labels") or {}
            return int(labels.get("com.docker.compose.container-number") or 0)

        return [c["Id"] for c in sorted(json.loads(inspected.stdout), key=number)]

    def one(self, service: str) -> str:
        found = self.containers(service)
        assert len(found) == 1, f"{service}: {len(found)} containers"
        return found[0]

    def inspect(self, container: str) -> dict[str, object]:
        done = self.tools.run("inspect", container)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout)[0])

    def health(self, container: str) -> tuple[str, str]:
        """(status, the last check's output) of a container's health check."""
        state = self.inspect(container)["State"]
        assert isinstance(state, dict)
        health = state.get("Health") or state.get("Healthcheck") or {}
        logs = health.get("Log") or [{}]
        return str(health.get("Status", "")), str((logs[-1] or {}).get("Output", "")).strip()

    def drive_health(self) -> None:
        """Podman without systemd: run the health checks of the running containers that have
        one (what podman's systemd timers do); Docker runs them itself."""
        if self.tools.engine != "podman":
            return
        for container in self.containers(running=True):
            config = self.inspect(container).get("Config") or {}
            assert isinstance(config, dict)
            if config.get("Healthcheck") or config.get("HealthcheckOnFailureAction"):
                self.tools.run("healthcheck", "run", container, timeout=60)

    def wait_healthy(self, service: str, timeout: float = 300) -> None:
        """Until every container of `service` is healthy; AssertionError when one is
        unhealthy (the check failed `retries` times after `start_period`) or has exited,
        with its last check's output and the container's log."""
        deadline = time.monotonic() + timeout
        while True:
            self.drive_health()
            states = []
            for container in self.containers(service):
                status, output = self.health(container)
                running = self.inspect(container)["State"]["Running"]  # type: ignore[index]
                if status == "unhealthy" or not running:
                    raise AssertionError(
                        f"{service} is {status if running else 'not running'}: last check "
                        f"{output!r}\n{self.logs(container)[-3000:]}"
                    )
                states.append(status)
            if states and all(s == "healthy" for s in states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{service} not healthy after {timeout:g} s: {states}")
            time.sleep(1)

    def wait_exit(self, container: str, timeout: float = 300) -> int:
        done = self.tools.run("wait", container, timeout=timeout)
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip().splitlines()[-1])

    def logs(self, container: str) -> str:
        done = self.tools.run("logs", container)
        return done.stdout + done.stderr

    # --- the user's commands ---------------------------------------------------------------

    def start(self, *services: str, timeout: float = 600) -> None:
        """`compose up -d SERVICES`: with their dependencies, each started once those it
        depends on are healthy (by compose itself where it can, see `orders_by_health`)."""
        if self.tools.orders_by_health:
            self.compose("up", "-d", *services, timeout=timeout)
            return
        config = self.config()["services"]
        for service in self.start_order(config, services):
            for dependency, rule in (config[service].get("depends_on") or {}).items():
                if rule.get("condition") == "service_healthy":
                    self.wait_healthy(dependency, timeout)
            self.compose("up", "-d", "--no-deps", service, timeout=timeout)

    @staticmethod
    def start_order(config: dict, services: Sequence[str]) -> list[str]:
        order: list[str] = []

        def visit(name: str) -> None:
            for dependency in config[name].get("depends_on") or {}:
                visit(dependency)
            if name not in order:
                order.append(name)

        for name in services or list(config):
            visit(name)
        return order

    def config(self) -> dict:
        """The project's compose files merged, as parsed YAML (what `compose config` says)."""
        import yaml

        merged: dict = {}
        for path in self.files:
            for name, service in (yaml.safe_load(path.read_text()).get("services") or {}).items():
                merged.setdefault("services", {}).setdefault(name, {}).update(service)
        return merged

    def run_client(self, timeout: float = 300) -> tuple[int, str]:
        """The demo client, started afresh against the running server: its exit code and
        output (`compose up -d --no-deps client`, what `compose up` runs once the server is
        healthy)."""
        for container in self.containers("client"):
            self.tools.run("rm", "-f", container)
        self.compose("up", "-d", "--no-deps", "client")
        container = self.one("client")
        return self.wait_exit(container, timeout), self.logs(container)

    def down(self, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.compose("down", "--remove-orphans", timeout=timeout, check=False)

    def teardown(self) -> None:
        """Remove everything of the project, whatever state it is in."""
        self.down()
        for container in self.containers():
            self.tools.run("rm", "-f", container)
        if self.tools.engine == "podman":
            self.tools.run("pod", "rm", "-f", f"pod_{self.project}")  # podman-compose's pod
        self.tools.run("network", "rm", f"{self.project}_default")
