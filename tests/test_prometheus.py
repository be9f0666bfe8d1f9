"""A real Prometheus (Debian's `prometheus`) scraping a real server on loopback, and the
deploy/monitoring files it and Grafana read.

The test starts Prometheus with a scrape interval of half a second against the server's HTTP
port, sends transcriptions while it scrapes, then asks its HTTP API (/api/v1/query) for the
request rate and a latency quantile. Every query of the Grafana dashboard (and of the example
alerts) is sent to it too: each must parse, return series after the mix of tests/test_metrics
(a live stream, a refusal, gRPC and HTTP transcriptions), and name only metrics the server's
/metrics has.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml
from conftest import requires_tool
from test_metrics import mix, wait_idle, wait_until

from benchmarks.replicas import free_port
from benchmarks.scrape import families, value
from xattn.model.audio.features import decode_audio
from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.background import BackgroundServer
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "xattn.json"
TOTAL = "sum(xattn_requests_total)"
WINDOW = "30s"  # the range of rate() here ($__rate_interval in Grafana)
# PromQL words that are not metric names
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
            "or", "unless", "offset", "inf", "nan"}  # fmt: skip


class Prometheus:
    """`prometheus` scraping `target` (HOST:PORT of /metrics) every 0.5 s, job "xattn"."""

    def __init__(self, binary: str, target: str, folder: Path) -> None:
        config = {
            "global": {"scrape_interval": "500ms", "evaluation_interval": "500ms"},
            "scrape_configs": [{"job_name": "xattn", "static_configs": [{"targets": [target]}]}],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        command = [binary, f"--config.file={folder / 'prometheus.yml'}"]
        command += [f"--storage.tsdb.path={folder / 'data'}"]
        command += [f"--web.listen-address={self.url.removeprefix('http://')}"]
        self.log = (folder / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self._ready, "Prometheus never ready", 60)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, "prometheus exited"
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def query(self, expr: str) -> dict:
        """/api/v1/query's answer (status, data or error) for `expr`, now."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return dict(json.loads(reply.read()))
        except urllib.error.HTTPError as e:  # 400: the expression does not parse
            return dict(json.loads(e.read()))

    def values(self, expr: str) -> list[float]:
        """The values of the series `expr` gives now."""
        answer = self.query(expr)
        assert answer["status"] == "success", (expr, answer)
        return [float(r["value"][1]) for r in answer["data"]["result"]]

    def scalar(self, expr: str) -> float:
        found = self.values(expr)
        assert len(found) == 1, (expr, found)
        return found[0]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return load_pipeline("tiny.en")


@pytest.fixture(scope="module")
def scraped(
    pipeline: Pipeline, jfk_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BackgroundServer, Prometheus, int]]:
    """A server (1 worker, no queue, HTTP on), Prometheus scraping it, and some traffic:
    short gRPC transcriptions, then tests/test_metrics' mix; (server, prometheus, calls)."""
    binary = requires_tool("prometheus")
    config = ServerConfig(port=0, http_port=0, workers=1, max_queue=0)
    with BackgroundServer(config, pipeline) as server:
        prometheus = Prometheus(binary, server.http_address, tmp_path_factory.mktemp("prom"))
        try:
            wait_until(lambda: prometheus.values("up") == [1.0], "never scraped", 60)
            metrics = f"http://{server.http_address}/metrics"
            short = pb.Audio(pcm=pb.Pcm(data=bytes(16000), sample_rate=16000, encoding=1))
            calls = 4
            with grpc.insecure_channel(server.address) as channel:
                stub = transcriber_pb2_grpc.TranscriberStub(channel)
                for _ in range(calls):  # scraped between them: the counter rises
                    stub.Transcribe(pb.TranscribeRequest(audio=short), timeout=120)
                    wait_idle(server)
                    sent = value(families(metrics), "xattn_requests_total")
                    wait_until(lambda n=sent: prometheus.values(TOTAL) == [n], "no scrape", 30)
            pcm = (decode_audio(jfk_path) * 32767).astype("<i2").tobytes()
            mix(server, jfk_path.read_bytes(), pcm)
            total = value(families(metrics), "xattn_requests_total")
            wait_until(lambda: prometheus.values(TOTAL) == [total], "never scraped it all", 30)
            time.sleep(1.0)  # two more scrapes: rate() has the last counts twice
            yield server, prometheus, calls
        finally:
            prometheus.close()


def test_request_rate_and_latency_quantile(scraped: tuple) -> None:
    _, prometheus, calls = scraped
    method = 'method="xattn.v1.Transcriber/Transcribe"'
    rate = prometheus.scalar(f"sum(rate(xattn_requests_total{{{method}}}[{WINDOW}]))")
    assert rate > 0
    increase = prometheus.scalar(f"sum(increase(xattn_requests_total{{{method}}}[5m]))")
    assert increase >= calls - 1  # the first call's series began at 1 (extrapolated aside)
    p90 = prometheus.scalar(
        "histogram_quantile(0.9, sum by (le) "
        f"(rate(xattn_request_duration_seconds_bucket{{{method}}}[{WINDOW}])))"
    )
    assert 0 < p90 < 600
    assert prometheus.scalar('count(xattn_model_info{model="tiny.en"})') == 1


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, label matchers, ranges,
    grouping lists and function names left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = re.findall(r"(?<![\w.])([A-Za-z_:][\w:]*)\b(?!\s*\()", expr)
    return {n for n in names if n.lower() not in KEYWORDS}


def test_metric_names_are_read_from_promql() -> None:
    expr = 'histogram_quantile(0.9, sum by (le, model) (rate(a_bucket{x=~"b|c"}[5m]))) / on(x) b'
    assert metric_names(expr) == {"a_bucket", "b"}
    assert metric_names("sum(rate(c_total[1m])) > 0.1 and d == 0") == {"c_total", "d"}


def grafana_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel target and template variable, with Grafana's
    variables replaced by what they stand for here."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = [
        (f"panel {p['title']!r} {t['refId']}", t["expr"])
        for p in dashboard["panels"]
        for t in p["targets"]
    ]
    for var in dashboard["templating"]["list"]:
        name = re.fullmatch(r"label_values\((\w+), *\w+\)", var["definition"])
        assert name, var["definition"]
        out.append((f"variable {var['name']}", name.group(1)))
    return [(w, e.replace("$__rate_interval", WINDOW).replace("$model", ".*")) for w, e in out]


def alert_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [(f"alert {r['alert']}", r["expr"]) for g in rules["groups"] for r in g["rules"]]


def test_dashboard_and_alert_queries_run_against_the_server(scraped: tuple) -> None:
    server, prometheus, _ = scraped
    exported = {s.name for f in families(f"http://{server.http_address}/metrics").values()
                for s in f.samples}  # fmt: skip
    queries = grafana_queries() + alert_queries()
    assert len(queries) >= 12
    for where, expr in queries:
        unknown = metric_names(expr) - exported
        assert not unknown, f"{where}: {expr} names {unknown}, which /metrics has not"
        answer = prometheus.query(expr)
        assert answer["status"] == "success", (where, expr, answer)
        if where.startswith(("panel", "variable")):  # the alerts' conditions hold no series
            assert answer["data"]["result"], f"{where}: no series for {expr}"


def test_prometheus_config_and_rules_pass_promtool() -> None:
    promtool = requires_tool("promtool")
    for command in (("check", "config", "prometheus.yml"), ("check", "rules", "alerts.yml")):
        done = subprocess.run(
            [promtool, *command], cwd=MONITORING, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
    scrape = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]
    jobs = {job["job_name"] for job in scrape}
    assert {"xattn", "xattn-replicas", "haproxy"} <= jobs  # the balancer beside the replicas


def test_grafana_provisioning_points_at_the_dashboard() -> None:
    provisioning = MONITORING / "grafana" / "provisioning"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {uid}
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("latency", "queue wait", "batch", "encoder", "lag", "refusals", "memory"):
        assert topic in titles, topic


def test_compose_monitoring_profile_mounts_these_files() -> None:
    """docker-compose.yml's `monitoring` profile: Prometheus and Grafana read deploy/monitoring
    (and write only their named data volumes), and Prometheus scrapes the server's HTTP port."""
    whole = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    compose = whole["services"]
    for name in ("prometheus", "grafana"):
        assert compose[name]["profiles"] == ["monitoring"]
        for volume in compose[name]["volumes"]:
            source = volume.split(":")[0]
            if not source.startswith("."):  # a named volume: its database
                assert source in whole["volumes"] and not volume.endswith(":ro"), volume
                continue
            assert (ROOT / source).exists(), (name, volume)
            assert source.startswith("./deploy/monitoring/") and volume.endswith(":ro")
    http_port = compose["server"]["environment"]["XATTN_HTTP_PORT"]
    scrape = yaml.safe_load((MONITORING / "prometheus.yml").read_text())["scrape_configs"]
    (server,) = [job for job in scrape if job["job_name"] == "xattn"]
    assert server["static_configs"][0]["targets"] == [f"server:{http_port.split('-')[-1][:-1]}"]
