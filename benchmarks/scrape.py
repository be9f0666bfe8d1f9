"""A running server's /metrics, parsed with prometheus_client's own parser, for tests and
benchmarks: `families(url)`, `value(families, name, **labels)` (the sum over the series
that match), and `engine_counters(url)`, the engine's transcription counters by outcome (what
the old stats file held: admitted, rejected, finished, cancelled, ..., in_flight).
"""

from __future__ import annotations

import urllib.request

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

OUTCOMES = ("finished", "cancelled", "failed", "invalid")


def text(url: str, timeout: float = 10.0) -> str:
    """The exposition at `url` (http://HOST:PORT/metrics) in the Prometheus text format."""
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return str(reply.read().decode())


def parse(exposition: str) -> dict[str, Metric]:
    """Families by name (a counter's without `_total`, as the parser names them)."""
    return {f.name: f for f in text_string_to_metric_families(exposition)}


def families(url: str, timeout: float = 10.0) -> dict[str, Metric]:
    return parse(text(url, timeout))


def value(found: dict[str, Metric], sample: str, **labels: str) -> float:
    """The sum of the samples named `sample` (e.g. xattn_requests_total,
    xattn_queue_wait_seconds_count) whose labels include `labels`; 0 when there is none."""
    family = found.get(_family_of(sample, found))
    if family is None:
        return 0.0
    return sum(
        s.value
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _family_of(sample: str, found: dict[str, Metric]) -> str:
    for suffix in ("_total", "_count", "_sum", "_bucket", "_info", ""):
        if suffix and sample.endswith(suffix) and sample[: -len(suffix)] in found:
            return sample[: -len(suffix)]
    return sample


def engine_counters(url: str, timeout: float = 10.0) -> dict[str, int]:
    """The engine's transcriptions (files and live streams, all models) by outcome, with
    admitted, rejected (refused), in_flight, tokens_decoded and windows."""
    found = families(url, timeout)
    counters = {o: int(value(found, "xattn_transcriptions_total", outcome=o)) for o in OUTCOMES}
    counters["admitted"] = int(value(found, "xattn_transcriptions_admitted_total"))
    counters["rejected"] = int(value(found, "xattn_refusals_total"))
    counters["in_flight"] = int(value(found, "xattn_requests_in_flight"))
    counters["tokens_decoded"] = int(value(found, "xattn_tokens_total"))
    counters["windows"] = int(value(found, "xattn_windows_total"))
    return counters
