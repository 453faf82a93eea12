"""retire's counters in vLLM's Prometheus registry, read at scrape time.

Invariant: `/metrics` is vLLM's own endpoint and registry; this collector only adds `retire_*` families: the facade's
`stats()` counters (e.g. `retire_obsolete_tokens_published_total`, which must stay 0 under "retire") and the
server's own (refusals by status, superseded streams, gate drops, unavailable answers).
"""
from __future__ import annotations

import re


class RetireCollector:
    def __init__(self, server):
        self.server = server

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        eng = self.server.eng
        if eng is not None:
            for k, v in sorted(eng.stats().items()):
                if isinstance(v, (int, float)):
                    yield CounterMetricFamily(f"retire_{_name(k)}", f"RetireEngine.stats()[{k!r}]", value=v)
        fam = CounterMetricFamily("retire_serve_events", "retire serve events by kind", labels=["kind"])
        for k, v in sorted(self.server.stats.items()):
            fam.add_metric([k], v)
        yield fam
        up = GaugeMetricFamily("retire_serve_ready", "1 when the engine is up and healthy")
        up.add_metric([], 1.0 if self.server.state == "ready" else 0.0)
        yield up


def _name(k: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", k)


def install(server) -> None:
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    get_prometheus_registry().register(RetireCollector(server))
