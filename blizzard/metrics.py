"""What the servers' Prometheus metrics share: a cheap latency histogram and the HTTP endpoint.

The hot paths (a master loop pass handles thousands of requests a second) do not call
``prometheus_client`` at all: they add to ``Timing`` objects, plain Python with no lock
(a bisect and three additions, well under a microsecond), and a collector turns them into
metric families when ``/metrics`` is scraped. The scrape runs in the HTTP server's thread
while the loop goes on, so a histogram read there may be one observation behind in a bucket;
its count is the sum of its buckets, so what Prometheus gets is always consistent.
Each process has its own ``CollectorRegistry`` (not the global one) and serves it only when
``--metrics-port`` is given.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from typing import Any, Iterable

from prometheus_client import start_http_server
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)

# Upper bounds in seconds: a request handled in memory takes microseconds, an fsync about a
# millisecond on an SSD, a slow disk or a big batch up to seconds.
LATENCY_BUCKETS_S = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                     0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Timing:
    """Observations of one duration (one label set of a histogram), kept in plain Python."""

    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets (``le`` -> observations at most that), +Inf last."""
        counts = list(self.counts)  # one copy, so the buckets agree with each other
        out, total = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS_S), "+Inf"), counts):
            total += n
            out.append((bound, total))
        return out


def histogram(name: str, doc: str, timings: Iterable[tuple[tuple[str, ...], Timing]],
              labels: Iterable[str] = ()) -> HistogramMetricFamily:
    """A histogram family from ``(label values, Timing)`` pairs."""
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for values, timing in timings:
        family.add_metric(list(values), timing.cumulative(), timing.sum_s)
    return family


class MetricsUnavailable(OSError):
    """Raised when the metrics endpoint cannot listen on its address and port."""


class Endpoint:
    """``/metrics`` of one registry, served over HTTP from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str) -> None:
        try:
            self._httpd, _ = start_http_server(port, addr, registry=registry)
        except OSError as exc:
            raise MetricsUnavailable(f"cannot serve metrics on {addr}:{port}: "
                                     f"{exc.strerror or exc}") from None
        self.url = f"http://{addr}:{self.port}/metrics"
        log.info("Prometheus metrics on %s", self.url)

    @property
    def port(self) -> int:
        """The port bound (a free one if 0 was asked for)."""
        return self._httpd.server_port

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class ServedCollector(Collector):
    """A process's collector in a registry of its own, served on ``/metrics`` when the
    server's config names a port (``metrics_port``, ``metrics_addr``).

    ``export`` is called from the server's constructor, so a port in use fails the start as
    an address in use for its socket does (``MetricsUnavailable``).
    """

    endpoint: Endpoint | None = None

    def export(self, config: Any) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        if config.metrics_port is not None and self.endpoint is None:
            self.endpoint = Endpoint(self.registry, config.metrics_port, config.metrics_addr)

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
