"""deploy/kubernetes/ (a kustomize base and the production overlay), offline.

- Rendering: the overlay is kustomize's own format, rendered here by `render` (resources,
  namespace, images, replicas and strategic-merge patches: the subset the files use) and,
  where `kubectl` is installed, compared with `kubectl kustomize` (the real renderer);
- every rendered document of base and overlay passes the Kubernetes API's JSON schemas in
  strict mode (kubernetes-validate, Kubernetes 1.30 and its newest), and broken copies fail;
- what no schema sees: probes point at a container port that exists, one handler each, an
  exec probe's script is in the image; the Services select the pods and name their port; the
  PodDisruptionBudget and the autoscaler point at the Deployment; the grace periods are
  ordered (terminationGracePeriodSeconds > preStop + XATTN_GRACE); XATTN_* are real server
  flags; non-root with the image's uid, read-only root filesystem with a writable /tmp;
  memory limits above the measured peak RSS; the overlay's secret paths are the files
  deploy/make_secrets.sh writes;
- the same image as docker-compose.yml, run the same way: ports, health probe, non-root user
  (the Dockerfile's), read-only root with /tmp writable, settings, limits, stop grace.
"""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from conftest import requires_tool
from kustomize import Doc, by_kind, render

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
BASE, PRODUCTION = KUBE / "base", KUBE / "overlays" / "production"
DOCKERFILE = ROOT / "Dockerfile"
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
MEASURED_PEAK_RSS = 1.4 * 2**30  # bytes: tiny.en, one worker, 8-16 streams (README)


@pytest.fixture(scope="module", params=["base", "production"])
def rendered(request: pytest.FixtureRequest) -> dict[tuple[str, str], Doc]:
    return by_kind(render(BASE if request.param == "base" else PRODUCTION))


def deployment(docs: dict[tuple[str, str], Doc]) -> Doc:
    return docs[("Deployment", "xattn-server")]


def container(docs: dict[tuple[str, str], Doc]) -> Doc:
    (server,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    return server


def env_of(c: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", [])}


# --- rendering and the schemas --------------------------------------------------------------


@pytest.mark.parametrize("folder", [BASE, PRODUCTION], ids=["base", "production"])
def test_render_matches_kubectl_kustomize(folder: Path) -> None:
    kubectl = requires_tool("kubectl")  # without it, render() alone is checked (elsewhere)
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert by_kind([d for d in yaml.safe_load_all(done.stdout) if d]) == by_kind(render(folder))


def schema_errors(doc: Doc) -> list[str]:
    errors = []
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{version}: {e.message}")
    return errors


def test_every_document_passes_the_api_schemas(rendered: dict[tuple[str, str], Doc]) -> None:
    kinds = sorted(kind for kind, _ in rendered)
    assert kinds == sorted(
        ["Deployment", "Service", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"]
    )
    for key, doc in rendered.items():
        assert schema_errors(doc) == [], key


def _first_container(d: Doc) -> Doc:
    return d["spec"]["template"]["spec"]["containers"][0]


BREAKERS: dict[str, tuple[str, Callable[[Doc], None]]] = {
    "replicas-as-text": ("Deployment", lambda d: d["spec"].update(replicas="three")),
    "unknown-field": ("Deployment", lambda d: _first_container(d).update(imagePullPolicyy="Never")),
    "grpc-probe-on-a-named-port": (
        "Deployment",
        lambda d: _first_container(d)["startupProbe"].update(grpc={"port": "grpc"}),
    ),
    "container-port-out-of-type": (
        "Deployment",
        lambda d: _first_container(d)["ports"][0].update(containerPort="50051/tcp"),
    ),
    "service-without-ports-list": ("Service", lambda d: d["spec"].update(ports={"port": 1})),
    "autoscaler-target-as-text": (
        "HorizontalPodAutoscaler",
        lambda d: d["spec"]["metrics"][0]["resource"]["target"].update(averageUtilization="70%"),
    ),
    "autoscaler-without-target": (
        "HorizontalPodAutoscaler",
        lambda d: d["spec"].pop("scaleTargetRef"),
    ),
    "budget-with-a-list": (
        "PodDisruptionBudget",
        lambda d: d["spec"].update(maxUnavailable=[1]),
    ),
}


@pytest.mark.parametrize("case", list(BREAKERS))
def test_broken_copies_are_rejected(case: str) -> None:
    kind, breaker = BREAKERS[case]
    doc = copy.deepcopy(next(d for d in render(PRODUCTION) if d["kind"] == kind))
    assert schema_errors(doc) == []
    breaker(doc)
    assert len(schema_errors(doc)) == len(VERSIONS), case


# --- what no schema sees ----------------------------------------------------------------------


def probe_problems(c: Doc) -> list[str]:
    """Each probe: one handler; gRPC on a container port (by number: the kubelet's gRPC probe
    takes no name); exec running a script the image has, within the probe's timeout."""
    problems = []
    ports = {p["containerPort"] for p in c.get("ports", [])}
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(name)
        if probe is None:
            problems.append(f"no {name}")
            continue
        handlers = [h for h in ("grpc", "exec", "httpGet", "tcpSocket") if h in probe]
        if len(handlers) != 1:
            problems.append(f"{name} has handlers {handlers}")
            continue
        if "grpc" in probe and probe["grpc"]["port"] not in ports:
            problems.append(f"{name} probes port {probe['grpc']['port']}, not in {ports}")
        if "httpGet" in probe:  # the HTTP API's /health, on its port (by name or number)
            get, names = probe["httpGet"], {p.get("name") for p in c.get("ports", [])}
            http = next((p for p in c.get("ports", []) if p.get("name") == "http"), None)
            if get["port"] not in names | ports or http is None:
                problems.append(f"{name} gets port {get['port']}, not in {names | ports}")
            elif get["port"] not in ("http", http["containerPort"]):
                problems.append(f"{name} gets port {get['port']}, not the HTTP API's")
            if get.get("path") != "/health":
                problems.append(f"{name} gets {get.get('path')}, not /health")
            tls = "XATTN_TLS_CERT" in env_of(c)
            if (get.get("scheme", "HTTP") == "HTTPS") != tls:
                problems.append(f"{name}: scheme {get.get('scheme', 'HTTP')} with TLS {tls}")
        if "exec" in probe:
            command = probe["exec"]["command"]
            script = next((w for w in command if w.endswith(".py")), "")
            if script != "/app/deploy/health_probe.py":
                problems.append(f"{name} runs {command}")
            own = float(command[command.index("--timeout") + 1]) if "--timeout" in command else 3
            if probe.get("timeoutSeconds", 1) <= own:
                problems.append(f"{name}: timeoutSeconds <= the probe's --timeout {own}")
    return problems


def grace_problems(d: Doc) -> list[str]:
    """SIGKILL must come after preStop + the server's drain, with room to exit (5 s)."""
    spec = d["spec"]["template"]["spec"]
    c = spec["containers"][0]
    command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_stop = float(command[1]) if command[:1] == ["sleep"] else 0.0
    grace = float(env_of(c).get("XATTN_GRACE", 10))
    total = spec.get("terminationGracePeriodSeconds", 30)
    if pre_stop < 2:
        return [f"preStop sleeps {pre_stop} s: too short for the endpoints to update"]
    if total < pre_stop + grace + 5:
        return [f"terminationGracePeriodSeconds {total} < preStop {pre_stop} + grace {grace} + 5"]
    return []


def test_probes_point_at_a_port_that_exists(rendered: dict[tuple[str, str], Doc]) -> None:
    c = container(rendered)
    assert probe_problems(c) == []
    assert env_of(c)["XATTN_PORT"] == str(c["ports"][0]["containerPort"])
    broken = copy.deepcopy(c)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if "grpc" in broken[probe]:
            broken[probe]["grpc"]["port"] = 50052
        elif "httpGet" in broken[probe]:
            broken[probe]["httpGet"]["port"] = "grpc"  # a port, but not the HTTP API's
        else:
            broken[probe]["exec"]["command"] = ["python", "/app/probe.py"]
    assert len(probe_problems(broken)) == 3
    # readiness asks the HTTP API's /health, on the port XATTN_HTTP_PORT names
    ready = c["readinessProbe"]["httpGet"]
    (http,) = [p for p in c["ports"] if p["name"] == "http"]
    assert ready["port"] == "http" and env_of(c)["XATTN_HTTP_PORT"] == str(http["containerPort"])
    for change in ({"path": "/healthz"}, {"port": 9999}, {"scheme": "HTTP", "path": "/health"}):
        wrong = copy.deepcopy(c)
        wrong["readinessProbe"]["httpGet"].update(change)
        if change.get("scheme") == "HTTP" and "XATTN_TLS_CERT" not in env_of(c):
            wrong["readinessProbe"]["httpGet"]["scheme"] = "HTTPS"  # TLS off: HTTPS is wrong
        assert len(probe_problems(wrong)) == 1, change
    two = copy.deepcopy(c)
    two["livenessProbe"]["tcpSocket"] = {"port": 50051}
    assert probe_problems(two) == [
        "livenessProbe has handlers "
        + str([h for h in ("grpc", "exec", "httpGet", "tcpSocket") if h in two["livenessProbe"]])
    ]


def test_the_probe_script_is_in_the_image() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "WORKDIR /app" in text and "COPY deploy/health_probe.py deploy/health_probe.py" in text


def test_grace_periods_are_ordered(rendered: dict[tuple[str, str], Doc]) -> None:
    d = deployment(rendered)
    assert grace_problems(d) == []
    short = copy.deepcopy(d)
    short["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 15
    assert grace_problems(short)
    long_drain = copy.deepcopy(d)
    for e in long_drain["spec"]["template"]["spec"]["containers"][0]["env"]:
        if e["name"] == "XATTN_GRACE":
            e["value"] = "25"
    assert grace_problems(long_drain)
    no_pre_stop = copy.deepcopy(d)
    del no_pre_stop["spec"]["template"]["spec"]["containers"][0]["lifecycle"]
    assert grace_problems(no_pre_stop)
    # the liveness probe must not restart a pod while it drains
    live = container(rendered)["livenessProbe"]
    grace = float(env_of(container(rendered))["XATTN_GRACE"])
    assert live["periodSeconds"] * live["failureThreshold"] > grace


def test_services_select_the_pods(rendered: dict[tuple[str, str], Doc]) -> None:
    pod_labels = deployment(rendered)["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in container(rendered)["ports"]}
    selector = deployment(rendered)["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    services = {name: d for (kind, name), d in rendered.items() if kind == "Service"}
    assert services["xattn-headless"]["spec"]["clusterIP"] == "None"
    assert services["xattn"]["spec"].get("type", "ClusterIP") == "ClusterIP"
    tls = "XATTN_TLS_CERT" in env_of(container(rendered))
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod_labels.items()
        grpc_port, http_port, wyoming_port = service["spec"]["ports"]
        assert grpc_port["targetPort"] in port_names
        assert grpc_port["name"] == "grpc" and grpc_port["appProtocol"] == "kubernetes.io/h2c"
        assert http_port["name"] == http_port["targetPort"] == "http" and "http" in port_names
        assert http_port["port"] == 8000 and http_port["protocol"] == "TCP"
        assert http_port["appProtocol"] == ("https" if tls else "http")  # the overlay's TLS
        assert wyoming_port["name"] == wyoming_port["targetPort"] == "wyoming" in port_names
        assert wyoming_port["port"] == 10300 and wyoming_port["protocol"] == "TCP"
    budget = rendered[("PodDisruptionBudget", "xattn-server")]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = rendered[("HorizontalPodAutoscaler", "xattn-server")]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "xattn-server",
    }
    assert hpa["metrics"][0]["resource"]["name"] == "cpu"
    assert hpa["minReplicas"] >= 2 and hpa["maxReplicas"] > hpa["minReplicas"]
    assert deployment(rendered)["spec"]["replicas"] >= hpa["minReplicas"]
    assert deployment(rendered)["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def server_flags() -> set[str]:
    from xattn.service.__main__ import parse_args

    return {f"XATTN_{a.upper()}" for a in vars(parse_args([]))}


def test_environment_is_the_servers(rendered: dict[tuple[str, str], Doc]) -> None:
    env = env_of(container(rendered))
    unknown = {k for k in env if k.startswith("XATTN_")} - server_flags()
    assert not unknown, f"not flags of xattn-server: {unknown}"
    assert env["XATTN_HOST"] == "0.0.0.0"
    limits = container(rendered)["resources"]["limits"]
    assert env["OMP_NUM_THREADS"] == str(limits["cpu"])  # torch threads = the CPU limit


def quantity(text: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9}
    number, unit = re.fullmatch(r"([\d.]+)([A-Za-z]*)", text).groups()  # type: ignore[union-attr]
    return float(number) * units.get(unit, 1)


def test_resources_and_security(rendered: dict[tuple[str, str], Doc]) -> None:
    c = container(rendered)
    requests, limits = c["resources"]["requests"], c["resources"]["limits"]
    assert quantity(requests["memory"]) >= MEASURED_PEAK_RSS
    assert quantity(limits["memory"]) >= quantity(requests["memory"])
    assert quantity(limits["cpu"]) >= quantity(requests["cpu"])
    pod = deployment(rendered)["spec"]["template"]["spec"]
    uid = re.search(r"ARG XATTN_UID=(\d+)", (ROOT / "Dockerfile").read_text())
    assert uid and pod["securityContext"]["runAsUser"] == int(uid[1])
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # MPLCONFIGDIR=/tmp/matplotlib (Dockerfile)
    assert "MPLCONFIGDIR=/tmp/" in (ROOT / "Dockerfile").read_text()


def test_production_overlay_wires_tls_and_tokens() -> None:
    docs = by_kind(render(PRODUCTION))
    c = container(docs)
    assert c["image"].startswith("registry.example.com/") and not c["image"].endswith(":local")
    assert container(by_kind(render(BASE)))["image"] == "xattn:local"  # docker-compose.yml's
    assert all(d["metadata"]["namespace"] == "xattn" for d in docs.values())
    assert deployment(docs)["spec"]["replicas"] == 3
    env = env_of(c)
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    secret = next(
        v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"] if "secret" in v
    )
    folder = mounts[secret["name"]]["mountPath"]
    assert mounts[secret["name"]]["readOnly"] is True
    # the files deploy/make_secrets.sh writes, as docker-compose.tls.yml uses them
    made = (ROOT / "deploy" / "make_secrets.sh").read_text()
    for var, file in (
        ("XATTN_TLS_CERT", "server.pem"),
        ("XATTN_TLS_KEY", "server.key"),
        ("XATTN_AUTH_TOKEN_FILE", "tokens"),
    ):
        assert env[var] == f"{folder}/{file}" and file in made, var
    # the kubelet's gRPC probe speaks plaintext only: with TLS startup and liveness are
    # exec; readiness gets the HTTP API's /health over HTTPS (the kubelet skips verifying)
    for name in ("startupProbe", "livenessProbe"):
        assert "exec" in c[name] and "grpc" not in c[name], name
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert set(c["readinessProbe"]) & {"exec", "grpc"} == set()


def test_pods_are_annotated_for_prometheus(rendered: dict[tuple[str, str], Doc]) -> None:
    """prometheus.io/* on the pods: /metrics on the HTTP API's port (https with TLS)."""
    notes = deployment(rendered)["spec"]["template"]["metadata"]["annotations"]
    ports = {p["name"]: p["containerPort"] for p in container(rendered)["ports"]}
    assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics"
    assert int(notes["prometheus.io/port"]) == ports["http"]
    assert int(env_of(container(rendered))["XATTN_HTTP_PORT"]) == ports["http"]
    tls = "XATTN_TLS_CERT" in env_of(container(rendered))
    assert notes.get("prometheus.io/scheme", "http") == ("https" if tls else "http")


def test_optional_service_monitor_selects_one_service() -> None:
    """deploy/kubernetes/monitoring: the Prometheus Operator's ServiceMonitor (a CRD, which
    the API schemas do not hold: checked here) selects the `xattn` Service alone and its
    `http` port."""
    (monitor,) = render(KUBE / "monitoring")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert set(monitor) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(monitor["spec"]) == {"selector", "endpoints"}
    base = by_kind(render(BASE))
    wanted = monitor["spec"]["selector"]["matchLabels"]
    chosen = [
        name
        for (kind, name), doc in base.items()
        if kind == "Service" and wanted.items() <= doc["metadata"].get("labels", {}).items()
    ]
    assert chosen == ["xattn"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert set(endpoint) <= {"port", "path", "interval", "scheme", "tlsConfig"}
    service_ports = {p["name"] for p in base[("Service", "xattn")]["spec"]["ports"]}
    assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
    assert re.fullmatch(r"\d+s", endpoint["interval"]) and endpoint["scheme"] == "http"


# --- the same image, run the same way as docker-compose.yml -----------------------------------


def agreement_problems(compose: Doc, deployment_doc: Doc) -> list[str]:
    """Where deploy/kubernetes and docker-compose.yml (with the Dockerfile) disagree about the
    image and how it runs: its ports, its health probe, its non-root user, its read-only root
    with a writable /tmp, the server's settings, the resources, a stop grace over the drain."""
    from test_compose import instructions, interpolate_defaults, seconds

    server = compose["services"]["server"]
    pod = deployment_doc["spec"]["template"]["spec"]
    c = pod["containers"][0]
    problems = []

    def differ(what: str, kube: object, other: object) -> None:
        if kube != other:
            problems.append(f"{what}: {kube!r} in Kubernetes, {other!r} in compose/Dockerfile")

    image = c["image"].rsplit(":", 1)[0].rsplit("/", 1)[-1]
    differ("image", image, server["image"].split(":")[0])
    steps = instructions()
    docker_env = dict(
        kv.split("=", 1) for k, rest in steps if k == "ENV" for kv in rest.split() if "=" in kv
    )
    exposed = {p for k, rest in steps if k == "EXPOSE" for p in rest.split()}
    compose_env = {k: interpolate_defaults(str(v)) for k, v in server["environment"].items()}
    ports = {p["name"]: str(p["containerPort"]) for p in c["ports"]}
    differ("gRPC port", ports.get("grpc"), compose_env["XATTN_PORT"])
    differ("HTTP port", ports.get("http"), compose_env["XATTN_HTTP_PORT"])
    differ("ports the image exposes", set(ports.values()), exposed)
    differ("the image's gRPC port", ports.get("grpc"), docker_env.get("XATTN_PORT"))
    kube_env = env_of(c)
    for name in sorted(set(kube_env) & set(compose_env)):
        differ(f"env {name}", kube_env[name], compose_env[name])
    # the health check: compose's (and the image's HEALTHCHECK) probe script, or the same
    # gRPC health service on the same port; startup at least as patient as start_period
    script = server["healthcheck"]["test"][-1]
    healthcheck = next(rest for k, rest in steps if k == "HEALTHCHECK")
    if script not in healthcheck:
        problems.append(f"compose's health check {script} is not the image's: {healthcheck}")
    for name in ("startupProbe", "livenessProbe"):
        probe = c[name]
        if "exec" in probe:
            differ(
                f"{name} script", script, next(w for w in probe["exec"]["command"] if ".py" in w)
            )
        else:
            differ(f"{name} gRPC port", str(probe.get("grpc", {}).get("port")), ports.get("grpc"))
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    if startup < seconds(server["healthcheck"]["start_period"]):
        problems.append(f"the startup probe gives up after {startup} s, before start_period")
    # the user and the filesystem
    uid, gid = interpolate_defaults(server["user"]).split(":")
    security = pod["securityContext"]
    differ("uid", str(security.get("runAsUser")), uid)
    differ("gid", str(security.get("runAsGroup")), gid)
    differ("the image's uid", uid, re.search(r"ARG XATTN_UID=(\d+)", DOCKERFILE.read_text())[1])
    differ("runAsNonRoot", security.get("runAsNonRoot"), True)
    differ(
        "read-only root", c["securityContext"].get("readOnlyRootFilesystem"), server["read_only"]
    )
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    differ("writable /tmp", "/tmp" in mounts, "/tmp" in server.get("tmpfs", []))
    # resources and the stop
    limits = c["resources"]["limits"]
    compose_limits = server["deploy"]["resources"]["limits"]
    differ("CPU limit", str(limits["cpu"]), interpolate_defaults(str(compose_limits["cpus"])))
    memory = interpolate_defaults(str(compose_limits["memory"]))
    differ("memory limit", quantity(limits["memory"]), quantity(memory.replace("G", "Gi")))
    drain = float(compose_env["XATTN_GRACE"]) + 5
    for what, grace in (
        ("terminationGracePeriodSeconds", pod.get("terminationGracePeriodSeconds", 30)),
        ("stop_grace_period", seconds(server["stop_grace_period"])),
    ):
        if grace < drain:
            problems.append(f"{what} {grace} s does not cover the drain ({drain} s)")
    return problems


def test_kubernetes_agrees_with_compose_and_the_image() -> None:
    from test_compose import load_compose

    compose = load_compose()
    for folder in (BASE, PRODUCTION):
        assert agreement_problems(compose, deployment(by_kind(render(folder)))) == [], folder
    images = yaml.safe_load((PRODUCTION / "kustomization.yaml").read_text())["images"]
    assert [i["name"] for i in images] == [compose["services"]["server"]["image"].split(":")[0]]
    base = deployment(by_kind(render(BASE)))
    for change, expected in (
        (
            lambda d, c: d["spec"]["template"]["spec"]["securityContext"].update(runAsUser=1001),
            "uid",
        ),
        (lambda d, c: _first_container(d)["ports"][0].update(containerPort=50061), "gRPC port"),
        (
            lambda d, c: c["services"]["server"]["healthcheck"].update(test=["CMD", "true"]),
            "health",
        ),
        (lambda d, c: c["services"]["server"].update(read_only=False), "read-only root"),
        (lambda d, c: c["services"]["server"].update(user="0:0"), "uid"),
        (lambda d, c: _first_container(d).update(image="other:local"), "image"),
    ):
        d, c = copy.deepcopy(base), copy.deepcopy(compose)
        change(d, c)
        problems = agreement_problems(c, d)
        assert any(expected in p for p in problems), (expected, problems)
