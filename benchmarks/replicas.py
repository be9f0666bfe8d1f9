"""Several xattn servers on loopback, optionally behind HAProxy: for tests/test_scale.py and
benchmarks/scale.py.

    with Replicas(3, folder) as replicas, Balancer(replicas.ports, folder) as lb:
        ...  # lb.address: the proxy; replicas.target(): "ipv4:127.0.0.1:p1,..." for round_robin

Each replica is `python -m xattn.service --port 0 --port-file ...` (one torch thread, one
worker unless told otherwise); `Replicas` waits until every one's health check says
SERVING; with `http=True` each also serves the HTTP API on a port of its own (http_ports).
Each serves /metrics on a port of its own too (`metrics_ports`; `counters(i)` reads it).
`Balancer` runs `haproxy -f deploy/haproxy/haproxy.cfg -f <servers.cfg>` (the
repository's config; only the backends' server lines are written here: gRPC, and HTTP when
given `http_ports`) and waits until HAProxy's own checks have marked every replica UP. Its
log (one line per call, with the server that served it and the caller's x-request-id) is
`Balancer.log_lines()`.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.scrape import engine_counters

ROOT = Path(__file__).resolve().parents[1]
HAPROXY_CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
SERVING = health_pb2.HealthCheckResponse.SERVING


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(address: str, timeout: float = 2.0) -> int | None:
    """The health service's status for "" (None: no answer)."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout
            )
        except grpc.RpcError:
            return None
    return int(reply.status)


def stats_csv(port: int) -> str | None:
    """The stats page of an HAProxy (haproxy.cfg's `frontend stats`) on 127.0.0.1:`port` as
    CSV; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/;csv", timeout=2) as reply:
            return str(reply.read().decode())
    except OSError:
        return None


def stats_servers(port: int, backend: str = "xattn") -> dict[str, dict[str, str]]:
    """The stats CSV rows of a backend's servers, by server name ({} while none answers)."""
    text = stats_csv(port)
    if text is None:
        return {}
    rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
    return {
        r["svname"]: r
        for r in rows
        if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")
    }


def wait_until(predicate: object, what: str, timeout: float, poll: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout:g} s")
        time.sleep(poll)


class Started:
    """A context manager over start() and stop(): stopped again if starting fails."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment for a server of another venv (no PYTHONPATH, VIRTUAL_ENV or
    XATTN_ settings of ours), with `extra` on top."""
    keep = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {k: v for k, v in keep.items() if not k.startswith("XATTN_")} | extra


class Spawned(Started):
    """One server process with a temporary folder of its own (`folder`), its output in
    `log`; stop(): SIGTERM, then SIGKILL after 30 s, and the folder removed."""

    name = "server"

    def __init__(self, prefix: str) -> None:
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._folder = tempfile.TemporaryDirectory(prefix=prefix)
        self.folder = Path(self._folder.name)
        self.log = self.folder / "server.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def spawn(self, command: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                command, cwd=cwd or self.folder, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def alive(self) -> None:
        """RuntimeError with the log's last lines if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace").strip().splitlines()[-8:]
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {' / '.join(tail)}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._folder.cleanup()


class Replicas(Started):
    """`count` server processes on free loopback ports; SIGTERM on exit (SIGKILL after 30 s)."""

    def __init__(
        self,
        count: int,
        folder: Path,
        args: tuple[str, ...] = (),
        threads: int = 1,
        http: bool = False,
    ) -> None:
        self.folder = folder
        self.http = http  # also the HTTP API (--http-port 0): http_ports[i]
        self.http_ports: list[int] = []
        self.metrics_ports: list[int] = []
        self.args = ("--workers", "1", "--grace", "20", *args)
        self.threads = threads
        self.procs: list[subprocess.Popen[bytes]] = []  # replica i: procs[i] on ports[i]
        self.ports: list[int] = []
        self.count = count

    def start(self, timeout: float = 180.0) -> Replicas:
        """Start every replica that is not running (all at first; after a fault, the dead
        ones, on new ports) and wait until each says SERVING."""
        self.procs += [None] * (self.count - len(self.procs))  # type: ignore[list-item]
        self.ports += [0] * (self.count - len(self.ports))
        self.http_ports += [0] * (self.count - len(self.http_ports))
        self.metrics_ports += [0] * (self.count - len(self.metrics_ports))
        fresh = [i for i, p in enumerate(self.procs) if p is None or p.poll() is not None]
        for i in fresh:
            self._spawn(i)
        for i in fresh:
            port_file = self.folder / f"replica{i}.port"
            wait_until(lambda f=port_file, i=i: self._alive(i) and f.exists(), "no port", timeout)
            self.ports[i] = int(port_file.read_text())
            metrics_file = self.folder / f"replica{i}.metrics-port"
            wait_until(lambda f=metrics_file, i=i: self._alive(i) and f.exists(), "no port", 30)
            self.metrics_ports[i] = int(metrics_file.read_text())
            if self.http:
                http_file = self.folder / f"replica{i}.http-port"
                wait_until(lambda f=http_file, i=i: self._alive(i) and f.exists(), "no port", 30)
                self.http_ports[i] = int(http_file.read_text())
        for i in fresh:
            wait_until(
                lambda i=i: self._alive(i) and health(self.addresses()[i]) == SERVING,
                f"replica {i} never SERVING",
                timeout,
                poll=0.25,
            )
        return self

    def _spawn(self, i: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("XATTN_")}
        env["OMP_NUM_THREADS"] = str(self.threads)
        port_file = self.folder / f"replica{i}.port"
        port_file.unlink(missing_ok=True)
        http_file = self.folder / f"replica{i}.http-port"
        http_file.unlink(missing_ok=True)
        metrics_file = self.folder / f"replica{i}.metrics-port"
        metrics_file.unlink(missing_ok=True)
        log = (self.folder / f"replica{i}.log").open("ab")
        command = [sys.executable, "-m", "xattn.service", "--port", "0"]
        command += ["--port-file", str(port_file), *self.args]
        command += ["--metrics-port", "0", "--metrics-port-file", str(metrics_file)]
        if self.http:
            command += ["--http-port", "0", "--http-port-file", str(http_file)]
        self.procs[i] = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )

    def _alive(self, i: int) -> bool:
        if self.procs[i].poll() is not None:
            log = (self.folder / f"replica{i}.log").read_text(errors="replace")
            raise RuntimeError(f"replica {i} exited {self.procs[i].returncode}:\n{log[-3000:]}")
        return True

    def counters(self, i: int) -> dict[str, int]:
        """Replica i's engine counters now (admitted, in_flight, ...: its /metrics); {} when
        it does not answer."""
        try:
            return engine_counters(f"http://127.0.0.1:{self.metrics_ports[i]}/metrics", 5)
        except OSError:
            return {}

    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def target(self) -> str:
        """The gRPC target of all replicas, for client-side round_robin."""
        return "ipv4:" + ",".join(self.addresses())

    def signal(self, i: int, sig: signal.Signals) -> None:
        self.procs[i].send_signal(sig)

    def stop(self) -> None:
        procs = [p for p in self.procs if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


class Balancer(Started):
    """HAProxy with the repository's config in front of `ports` on 127.0.0.1."""

    def __init__(self, ports: list[int], folder: Path, http_ports: list[int] | None = None) -> None:
        self.ports = ports
        self.http_ports = http_ports or []
        self.folder = folder
        self.port = free_port()
        self.http_port = free_port()
        self.stats_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.http_address = f"127.0.0.1:{self.http_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = folder / "haproxy.log"

    @staticmethod
    def binary() -> str | None:
        return shutil.which("haproxy") or next(
            (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if Path(p).is_file()),
            None,
        )

    def servers_cfg(self) -> str:
        """Both backends haproxy.cfg names: gRPC on `ports`, HTTP on `http_ports` (may be none:
        the HTTP frontend then answers 503)."""
        lines = ["backend xattn"]
        lines += [f"    server r{i} 127.0.0.1:{port}" for i, port in enumerate(self.ports)]
        lines += ["", "backend xattn_http from xattn_http"]
        lines += [f"    server h{i} 127.0.0.1:{port}" for i, port in enumerate(self.http_ports)]
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 30.0) -> Balancer:
        binary = self.binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
        servers = self.folder / "servers.cfg"
        servers.write_text(self.servers_cfg())
        env = {
            **os.environ,
            "XATTN_LB_BIND": self.address,
            "XATTN_LB_HTTP_BIND": self.http_address,
            "XATTN_LB_STATS": f"127.0.0.1:{self.stats_port}",
        }
        command = [binary, "-db", "-f", str(HAPROXY_CFG), "-f", str(servers)]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        http = {f"h{i}" for i in range(len(self.http_ports))}
        wait_until(
            lambda: (
                self._alive()
                and self.stats_csv() is not None  # listening (with no servers, up() is empty)
                and self.up() == {f"r{i}" for i in range(len(self.ports))}
                and self.up("xattn_http") == http
            ),
            "HAProxy never saw every replica UP",
            timeout,
        )
        return self

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited: {self.log_path.read_text(errors='replace')}")
        return True

    def stats_csv(self) -> str | None:
        """HAProxy's stats page as CSV; None while it does not answer."""
        return stats_csv(self.stats_port)

    def servers(self, backend: str = "xattn") -> dict[str, dict[str, str]]:
        """HAProxy's stats CSV rows of a backend's servers, by server name."""
        return stats_servers(self.stats_port, backend)

    def up(self, backend: str = "xattn") -> set[str]:
        return {name for name, row in self.servers(backend).items() if row["status"] == "UP"}

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop: lets running calls end
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
