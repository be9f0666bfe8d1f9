"""The compose deploy run for real: the image docker-compose.yml builds (xattn:local), brought
up with the compose tool as a user does, and what the user would see.

`make compose-check` (deploy/compose_check.sh) builds the image and runs these tests (with
XATTN_COMPOSE_CHECK=1; `make test` skips them); without a container engine, a compose tool or
the image they skip, naming what is missing. Every
stack is a compose project of its own (xattn-check-*) on free loopback ports, with its own
out/ folder and secrets, removed at the end. What must hold:

- `compose up`: the server becomes healthy (its health check passes), then the demo client
  prints the sample's sentence word for word and writes the inspection page and the PNG to
  out/; the server runs as a non-root user on a read-only root filesystem;
- the HTTP port answers /health and the `openai` SDK with the same sentence; gRPC from the
  host answers the Python client;
- the inspector profile serves the page the client wrote, byte for byte;
- `compose down` with a transcription in flight: the call completes with the transcript an
  undisturbed call gets, the server drains and exits 0;
- docker-compose.tls.yml with deploy/make_secrets.sh's files: the demo works over TLS with
  the token; gRPC and HTTPS refuse a caller without it (UNAUTHENTICATED, 401) and plaintext;
- the scale profile: HAProxy spreads calls over all replicas and every call succeeds while
  one replica is killed (SIGKILL) under load.

The same checks fail on a broken deploy (the `test_broken_*` tests run them and expect the
failure): an image without the sample, a health check that never passes, an out/ folder
the client cannot write.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.request
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from compose_stack import IMAGE, ROOT, Stack, Tools, container_user, find_tools, hand_over

from benchmarks.replicas import stats_servers, wait_until
from benchmarks.scale_load import Outcome, call
from xattn.clients.api import ServerError, Unreachable, connect, open_channel
from xattn.clients.data import Finished, Token
from xattn.v1 import transcriber_pb2_grpc

SENTENCE = (
    "Speech recognition turns sound into text. Cross attention shows where the model listens."
)
HELLO = ROOT / "samples" / "hello.wav"
TLS_FILE = ROOT / "docker-compose.tls.yml"
REPLICAS = 3
PROBE = "/app/deploy/health_probe.py"  # the image's health check

pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def tools() -> Tools:
    if os.environ.get("XATTN_COMPOSE_CHECK") != "1":  # minutes of containers: only on request
        pytest.skip("compose stack: run by `make compose-check` (it builds the image first)")
    found = find_tools()
    if isinstance(found, str):
        pytest.skip(f"compose stack: {found}")
    return found


def words(text: str) -> str:
    return " ".join(text.split())


def demo_problems(code: int, output: str, out: Path) -> list[str]:
    """What is wrong with a run of the demo client: its exit code, its output (the sentence
    word for word, however the terminal wrapped it), the files it should have written."""
    problems = []
    if code != 0:
        problems.append(f"the client exited {code}")
    if SENTENCE not in words(output):
        problems.append("the sentence is not in its output")
    page, png = out / "index.html", out / "hello.png"
    if not page.is_file() or "<canvas" not in page.read_text(errors="replace"):
        problems.append(f"no inspection page at {page}")
    if not png.is_file() or png.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        problems.append(f"no heatmap at {png}")
    return problems


def check_demo(stack: Stack, out: Path) -> str:
    code, output = stack.run_client()
    problems = demo_problems(code, output, out)
    assert not problems, f"{problems}:\n{output[-3000:]}"
    return output


def out_folder(tmp: Path) -> Path:
    out = tmp / "out"
    out.mkdir(parents=True)  # the README's `mkdir -p out`: the containers' user's
    hand_over(out)
    return out


# --- the image itself ---------------------------------------------------------------------


def run_in_image(tools: Tools, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`sh -c script` in a container of the image as it is deployed: its user, a read-only
    root, /tmp a tmpfs, and no network at all (nothing may be downloaded)."""
    return tools.run(
        "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
        "--entrypoint", "sh", IMAGE, "-c", script, timeout=timeout,
    )  # fmt: skip


def test_image_serves_offline_as_a_non_root_user_without_a_compiler(tools: Tools) -> None:
    """The weights are inside (a server starts and transcribes with no network), the CPU
    builds of torch (no CUDA), no compiler, a non-root user."""
    script = (
        "id -u; for c in gcc g++ cc c++ clang; do command -v $c; done; "
        "python -c 'import torch, importlib.metadata as m; print(torch.version.cuda, "
        '[d.metadata["Name"] for d in m.distributions() if d.metadata["Name"]'
        '.startswith("nvidia")])\'; '
        "xattn-server & "
        "for i in $(seq 240); do python /app/deploy/health_probe.py >/dev/null 2>&1 && break; "
        "sleep 1; done; "
        "COLUMNS=200 xattn transcribe samples/hello.wav --server 127.0.0.1:50051"
    )
    done = run_in_image(tools, script)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    uid, cuda_line, *rest = done.stdout.splitlines()
    assert uid == "1000"
    assert cuda_line == "None []", cuda_line  # no compiler printed a path before it
    assert SENTENCE in words("\n".join(rest)), done.stdout


def test_image_labels_and_the_kubernetes_manifests(tools: Tools) -> None:
    """OCI labels; the user, ports and probe script the manifests in deploy/kubernetes expect."""
    from kustomize import by_kind, render

    inspected = tools.run("image", "inspect", IMAGE)
    assert inspected.returncode == 0, inspected.stderr
    (whole,) = json.loads(inspected.stdout)
    image = whole["Config"]
    labels = image.get("Labels") or {}
    oci = {k.removeprefix("org.opencontainers.image."): v for k, v in labels.items()}
    assert oci["title"] == "xattn" and oci["version"] and oci["description"], labels
    assert oci["revision"] and oci["created"] and oci["base.name"], labels
    if os.environ.get("XATTN_CHECK_REVISION"):  # the commit deploy/compose_check.sh built
        assert oci["revision"] == os.environ["XATTN_CHECK_REVISION"], labels
    assert image["User"] == "xattn"
    # Docker: Config.Healthcheck; podman: Healthcheck (built in the Docker format: OCI's has none)
    health = (image.get("Healthcheck") or whole.get("Healthcheck") or {}).get("Test") or []
    assert PROBE in health, health
    exposed = {port.split("/")[0] for port in image.get("ExposedPorts") or {}}
    for folder in ("base", "overlays/production"):
        docs = by_kind(render(ROOT / "deploy" / "kubernetes" / folder))
        pod = docs[("Deployment", "xattn-server")]["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        ports = {str(p["containerPort"]) for p in container["ports"]}
        assert ports <= exposed, (folder, ports, exposed)
        uid = run_in_image(tools, "id -u").stdout.strip()
        assert str(pod["securityContext"]["runAsUser"]) == uid, folder
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe].get("exec", {}).get("command", [])
            for script in (w for w in command if w.endswith(".py")):
                assert run_in_image(tools, f"test -f {script}").returncode == 0, script
    print(f"\nimage: {labels}")


# --- the default stack: server, demo client, inspector; `compose down` last ----------------


@pytest.fixture(scope="module")
def stack(tools: Tools, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    out = out_folder(tmp_path_factory.mktemp("stack"))
    # a drain as long as stop_grace_period allows (30 s - 5): the drain test's call must end
    # within it on a busy machine too
    running = Stack.new(tools, "main", out, XATTN_GRACE="25")
    try:
        running.start("server")
        yield running
    finally:
        running.teardown()


def test_server_becomes_healthy_as_a_non_root_user_on_a_read_only_root(stack: Stack) -> None:
    stack.wait_healthy("server")
    server = stack.one("server")
    status, output = stack.health(server)
    assert status == "healthy" and "SERVING" in output, output
    info = stack.inspect(server)
    assert info["Config"]["User"] == "{XATTN_UID}:{XATTN_GID}".format(**stack.env)  # type: ignore[index]
    assert info["HostConfig"]["ReadonlyRootfs"] is True  # type: ignore[index]
    done = stack.tools.run(
        "exec", server, "sh", "-c", "id -u; touch /app/x; touch /tmp/x && echo tmp"
    )
    uid, *rest = done.stdout.split()
    assert uid != "0" and rest == ["tmp"], done.stdout + done.stderr
    assert "Read-only file system" in done.stderr, done.stderr


def test_compose_up_runs_the_demo(stack: Stack) -> None:
    stack.wait_healthy("server")
    output = check_demo(stack, Path(stack.env["XATTN_OUT"]))
    lines = output.splitlines()
    head = lines[: next(i for i, line in enumerate(lines) if line.startswith("window"))]
    print("\ndemo client:\n" + "\n".join(f"  | {line}" for line in head))


def test_http_api_answers_the_openai_sdk_and_health(stack: Stack) -> None:
    import openai

    stack.wait_healthy("server")
    base = f"http://127.0.0.1:{stack.port('XATTN_HTTP_PORT')}"
    with urllib.request.urlopen(f"{base}/health", timeout=10) as reply:
        assert reply.status == 200 and b"SERVING" in reply.read()
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny.en"]
    with HELLO.open("rb") as audio:
        text = client.audio.transcriptions.create(model="tiny.en", file=audio).text
    assert words(text) == SENTENCE
    with connect(f"127.0.0.1:{stack.port('XATTN_PORT')}", timeout=30) as grpc_client:
        assert words(grpc_client.transcribe(HELLO).text) == SENTENCE


def test_inspector_serves_the_page_the_client_wrote(stack: Stack) -> None:
    out = Path(stack.env["XATTN_OUT"])
    if not (out / "index.html").is_file():
        stack.wait_healthy("server")
        check_demo(stack, out)
    inspector = stack.with_(profiles=["inspector"])
    inspector.compose("up", "-d", "--no-deps", "inspector")
    base = f"http://127.0.0.1:{stack.port('XATTN_INSPECTOR_PORT')}"

    def page(path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"{base}/{path}", timeout=5) as reply:
                return bytes(reply.read())
        except OSError:
            return None

    wait_until(lambda: page("") is not None, "the inspector answering", 60, poll=0.5)
    assert page("") == (out / "index.html").read_bytes()
    assert page("hello.png") == (out / "hello.png").read_bytes()


# --- breakages the checks above must catch -------------------------------------------------


@contextlib.contextmanager
def derived_image(tools: Tools, name: str, folder: Path, *steps: str) -> Iterator[str]:
    """xattn:local with `steps` (Dockerfile lines, run as root) on top, for a while."""
    tag = f"xattn:check-{name}"
    (folder / "Dockerfile").write_text(
        "\n".join([f"FROM {IMAGE}", "USER root", *steps, "USER xattn"])
    )
    built = tools.run("build", "-t", tag, str(folder), timeout=300)
    assert built.returncode == 0, built.stderr
    try:
        yield tag
    finally:
        tools.run("rmi", "-f", tag)


def test_broken_image_without_the_sample_fails_the_demo(
    stack: Stack, tools: Tools, tmp_path: Path
) -> None:
    """The demo client from an image that lacks samples/hello.wav."""
    if not stack.containers("server", running=True):
        pytest.skip("the main stack is down")
    override = tmp_path / "no-sample.yml"
    out = out_folder(tmp_path / "run")
    with derived_image(tools, "no-sample", tmp_path, "RUN rm /app/samples/hello.wav") as broken:
        override.write_text(f"services:\n  client:\n    image: {broken}\n")
        try:
            with pytest.raises(AssertionError, match="the client exited 2"):
                check_demo(stack.with_(override, XATTN_OUT=str(out)), out)
        finally:
            for container in stack.containers("client"):
                tools.run("rm", "-f", container)


def test_broken_out_folder_fails_the_demo(stack: Stack, tmp_path: Path) -> None:
    """out/ that the containers' user cannot write (root's, 0755, with XATTN_UID 1000)."""
    if not stack.containers("server", running=True):
        pytest.skip("the main stack is down")
    if container_user()[0] == 0 or os.geteuid() != 0:
        pytest.skip("needs root outside and a non-root user inside (the check's own setting)")
    out = tmp_path / "out"
    out.mkdir(mode=0o755)  # root's
    try:
        with pytest.raises(AssertionError, match="no inspection page"):
            check_demo(stack.with_(XATTN_OUT=str(out)), out)
    finally:
        for container in stack.containers("client"):
            stack.tools.run("rm", "-f", container)


def test_broken_health_check_never_passes(tools: Tools, tmp_path: Path) -> None:
    """A server whose image's health probe always fails: wait_healthy (compose up's wait for
    `service_healthy`) reports it unhealthy instead of going on."""
    override = tmp_path / "bad-health.yml"
    probe = "RUN echo 'raise SystemExit(\"unhealthy: broken on purpose\")' > " + PROBE
    with derived_image(tools, "bad-health", tmp_path, probe) as broken:
        override.write_text(  # scalars only: podman-compose extends lists it merges
            f"services:\n  server:\n    image: {broken}\n    healthcheck:\n"
            "      interval: 2s\n      retries: 2\n      start_period: 1s\n"
        )
        stack = Stack.new(tools, "bad-health", out_folder(tmp_path / "run")).with_(override)
        try:
            stack.compose("up", "-d", "--no-deps", "server")
            with pytest.raises(AssertionError, match="server is unhealthy: .*broken on purpose"):
                stack.wait_healthy("server", timeout=300)
        finally:
            stack.teardown()


# --- `compose down` with a call in flight (the main stack's end) ----------------------------


def long_audio(folder: Path, copies: int) -> Path:
    """hello.wav `copies` times over."""
    with wave.open(str(HELLO)) as w:
        params, frames = w.getparams(), w.readframes(w.getnframes())
    path = folder / f"hello-x{copies}.wav"
    with wave.open(str(path), "wb") as w:
        w.setparams(params)
        w.writeframes(frames * copies)
    return path


def test_compose_down_drains_a_request_in_flight(stack: Stack, tmp_path: Path) -> None:
    """A StreamTranscribe still decoding when the server starts to drain (its end arrives
    after the server's log says so) completes, with the transcript an undisturbed call gets;
    the server exits 0. The audio is one window, long enough that this machine, now, takes
    3 s or more (past the second `compose down` takes to send SIGTERM; the stack's drain
    allows 25 s)."""
    stack.wait_healthy("server")
    address = f"127.0.0.1:{stack.port('XATTN_PORT')}"
    with connect(address, timeout=30) as client:
        for copies in (1, 2):  # 8.6 s, or 17.2 s where that decodes in under 3 s: one window
            audio = long_audio(tmp_path, copies)
            started = time.monotonic()
            expected = client.transcribe(audio).text  # undisturbed
            undisturbed = time.monotonic() - started
            if undisturbed >= 3:
                break
    server = stack.one("server")
    engine_env = {**os.environ, **stack.tools.env}
    waiter = subprocess.Popen(
        [stack.tools.engine, "wait", server], env=engine_env, stdout=subprocess.PIPE, text=True
    )
    log: list[str] = []
    first, drained, outcome = threading.Event(), threading.Event(), {}

    def follow() -> None:  # the server's log as it is written
        logs = subprocess.Popen(
            [stack.tools.engine, "logs", "-f", server],
            env=engine_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in logs.stdout or []:
            log.append(line)
            if "draining in-flight" in line:
                outcome["drained"] = time.monotonic()
                drained.set()
        logs.wait()

    def stream() -> None:
        try:
            with connect(address, timeout=30) as c:
                for event in c.stream_transcribe(audio):
                    if isinstance(event, Token):
                        first.set()
                    elif isinstance(event, Finished):
                        outcome["text"], outcome["at"] = event.result.text, time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported below
            outcome["error"] = e
        finally:
            first.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    reader = threading.Thread(target=stream)
    reader.start()
    assert first.wait(120), "no token within 120 s"
    down_at = time.monotonic()
    down = stack.down()
    reader.join(120)
    follower.join(60)
    server_log = "".join(log)
    exit_code = int(waiter.communicate(timeout=60)[0].split()[-1])
    print(
        f"\ndrain: {audio.name} ({undisturbed:.1f} s undisturbed) streaming when `compose down` "
        f"ran; the server began draining {outcome.get('drained', down_at) - down_at:.1f} s "
        f"later; the stream ended {outcome.get('at', down_at) - down_at:.1f} s after `down`, "
        f"{'OK, same transcript' if outcome.get('text') == expected else outcome}; the server "
        f"exited {exit_code}; `down` took {time.monotonic() - down_at:.1f} s"
    )
    assert "error" not in outcome, f"{outcome}\n{server_log[-3000:]}"
    assert drained.is_set() and outcome["at"] > outcome["drained"], (
        "the call was not in flight when the server began to drain (it ended first): "
        f"{outcome}\n{server_log[-2000:]}"
    )
    assert outcome["text"] == expected, outcome
    assert down.returncode == 0, down.stdout
    assert "cancelling in-flight" not in server_log and "stopped" in server_log, server_log
    assert exit_code == 0, server_log[-3000:]
    assert stack.containers() == []


# --- TLS and tokens -------------------------------------------------------------------------


def test_tls_override_serves_only_authenticated_clients(tools: Tools, tmp_path: Path) -> None:
    import openai

    secrets = tmp_path / "secrets"
    made = subprocess.run(
        ["bash", str(ROOT / "deploy" / "make_secrets.sh"), str(secrets)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    hand_over(secrets)
    pem, token = secrets / "server.pem", (secrets / "tokens").read_text().split()[-1]
    out = out_folder(tmp_path)
    stack = Stack.new(tools, "tls", out, XATTN_SECRETS=str(secrets)).with_(TLS_FILE)
    try:
        stack.start("server")
        stack.wait_healthy("server")
        output = check_demo(stack, out)  # the client with --ca and --token-file
        assert "--ca" in " ".join(stack.config()["services"]["client"]["command"])
        address = f"localhost:{stack.port('XATTN_PORT')}"
        with connect(address, ca_file=pem, token=token, timeout=30) as client:
            assert words(client.transcribe(HELLO).text) == SENTENCE
        with connect(address, ca_file=pem, timeout=30) as client:
            with pytest.raises(ServerError) as refused:
                client.transcribe(HELLO)
        assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED.name
        with pytest.raises(Unreachable):  # plaintext to a TLS port: no connection
            connect(address, timeout=5).transcribe(HELLO)

        base = f"https://localhost:{stack.port('XATTN_HTTP_PORT')}"
        context = ssl.create_default_context(cafile=str(pem))
        with urllib.request.urlopen(f"{base}/health", timeout=10, context=context) as reply:
            assert reply.status == 200  # health needs no token
        http = openai.DefaultHttpxClient(verify=context)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=token, http_client=http)
        with HELLO.open("rb") as audio:
            assert words(client.audio.transcriptions.create(model="tiny.en", file=audio).text) == (
                SENTENCE
            )
        wrong = openai.OpenAI(
            base_url=f"{base}/v1", api_key="not-the-token", http_client=http, max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        with pytest.raises(urllib.error.URLError):  # the default trust store: not this CA
            urllib.request.urlopen(f"{base}/health", timeout=10)
        print(
            f"\ntls: demo over TLS ok; gRPC without token {refused.value.code}; "
            "HTTPS without token 401; plaintext refused"
        )
        assert SENTENCE in words(output)
    finally:
        stack.teardown()


# --- the scale profile ------------------------------------------------------------------------


def test_scale_profile_spreads_calls_and_survives_a_killed_replica(
    tools: Tools, tmp_path: Path
) -> None:
    stack = Stack.new(tools, "scale", out_folder(tmp_path), XATTN_REPLICAS=str(REPLICAS))
    stack = stack.with_(profiles=["scale"])
    stats = stack.port("XATTN_LB_STATS_PORT")

    def up() -> set[str]:
        return {n for n, row in stats_servers(stats).items() if row["status"] == "UP"}

    def served() -> dict[str, int]:
        return {n: int(row["stot"]) for n, row in stats_servers(stats).items()}

    try:
        stack.start("balancer", timeout=900)
        assert len(stack.containers("replica")) == REPLICAS
        wait_until(lambda: len(up()) == REPLICAS, f"{REPLICAS} replicas UP in HAProxy", 600, 1)
        address = f"127.0.0.1:{stack.port('XATTN_LB_PORT')}"
        before = served()
        # unary Transcribe calls over one channel with xattn's retry policy (api.open_channel),
        # as in tests/test_scale.py: a call the killed replica had taken is sent again to
        # another. (A StreamTranscribe that has already streamed tokens is never replayed: its
        # client gets an error status; docs/running-many.md.)
        data = HELLO.read_bytes()
        channel = open_channel(address)
        stub = transcriber_pb2_grpc.TranscriberStub(channel)

        def calls(n: int, start: int) -> list[Outcome]:
            with ThreadPoolExecutor(REPLICAS) as pool:
                return list(
                    pool.map(
                        lambda i: call(stub, "unary", data, f"check-{i}", 600),
                        range(start, start + n),
                    )
                )

        spread_calls = calls(2 * REPLICAS, 0)
        assert [o.status for o in spread_calls] == ["OK"] * (2 * REPLICAS), spread_calls
        expected = spread_calls[0].text
        assert "Cross attention shows where the model listens." in expected, expected
        assert {o.text for o in spread_calls} == {expected}
        spread = {n: served()[n] - before.get(n, 0) for n in up()}
        assert all(count > 0 for count in spread.values()) and len(spread) == REPLICAS, spread

        victim = stack.containers("replica")[0]
        dispatched = sum(served().values())
        with ThreadPoolExecutor(1) as background:
            load = background.submit(calls, 4 * REPLICAS, 100)
            # once each replica has been given a call (leastconn: one each), kill one
            wait_until(
                lambda: sum(served().values()) >= dispatched + REPLICAS, "calls under way", 300, 0.1
            )
            killed = tools.run("kill", victim)
            assert killed.returncode == 0, killed.stderr
            outcomes = load.result(timeout=900)
        channel.close()
        failed = [o for o in outcomes if o.status != "OK" or o.text != expected]
        assert not failed, failed
        print(
            f"\nscale: {2 * REPLICAS} transcriptions, HAProxy's calls per replica "
            f"{sorted(spread.values())}; {4 * REPLICAS} more, all OK with the same text, "
            f"replica {victim[:12]} killed (SIGKILL) while they ran"
        )
    finally:
        stack.teardown()
