"""What the servers' Prometheus metrics share: a cheap latency histogram and the HTTP endpoint.

The hot paths (a master loop pass handles thousands of requests a second) do not call
``prometheus_client`` at all: they add to ``Timing`` objects, plain Python with no lock
(a bisect and three additions, well under a microsecond), and a collector turns them into
metric families when ``/metrics`` is scraped. The scrape runs in the HTTP server's thread
while the loop goes on, so a histogram read there may be one observation behind in a bucket;
its count is the sum of its buckets, so what Prometheus gets is always consistent.
Each process has its own ``CollectorRegistry`` (not the global one) and serves it only when
``--metrics-port`` is given.

The endpoint runs in the server's own process, so it must never cost the server its loop:
it is a ``GuardedHTTPServer`` (``blizzard/net/http_guard.py``, as the status page: at most
``MAX_SCRAPES`` connections at once, each closed after ``IDLE_TIMEOUT_S`` of silence or
``CONNECTION_S`` in all, and only requests whose Host is the bind address, localhost, an IP
address or a name given with ``--metrics-allow-host``), and the text is rendered at most every
``RENDER_EVERY_S`` (``Renderer``): scrapes that come meanwhile wait and share one rendering,
so a flood of scrapes costs the process a few renderings a second, each of a bounded size
(the master names ``--metrics-queues`` queues, ``master/metrics.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from blizzard.net.http_guard import CONNECTION_S, IDLE_TIMEOUT_S, GuardedHTTPServer, respond
from blizzard.net.transport import FRAMES

log = logging.getLogger(__name__)

# Upper bounds in seconds: a request handled in memory takes microseconds, an fsync about a
# millisecond on an SSD, a slow disk or a big batch up to seconds.
MAX_SCRAPES = 16  # connections served at once (Prometheus keeps one); more are closed at once
RENDER_EVERY_S = 0.25  # the text is rendered at most this often; scrapes meanwhile share it
PATH = "/metrics"

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
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS_S), "+Inf"), counts, strict=True):
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


def frames() -> CounterMetricFamily:
    """ZeroMQ messages this process sent and received (requests, replies, reports, heartbeats):
    divided by the items moved, the messages each item costs."""
    family = CounterMetricFamily("blizzard_messages", "ZeroMQ messages this process sent and "
                                 "received, of every kind.", labels=["direction"])
    for direction, count in FRAMES.items():
        family.add_metric([direction], count)
    return family


class Renderer:
    """A registry's text, rendered at most every ``every_s`` and shared by the scrapes that
    wait for it; never older than the scrape it answers (each gets a rendering begun after
    it came)."""

    def __init__(self, registry: CollectorRegistry, every_s: float = RENDER_EVERY_S) -> None:
        self.registry = registry
        self.every_s = every_s
        self.lock = threading.Lock()  # one rendering at a time; the others wait for it
        self.began = float("-inf")  # monotonic start of the last rendering
        self.body = b""

    def body_for(self, came: float) -> bytes:
        """The text for a scrape that came at ``came`` (monotonic)."""
        with self.lock:
            if self.began >= came:  # begun after this scrape came: its answer too
                return self.body
            pause = self.began + self.every_s - time.monotonic()
            if pause > 0:  # a rate, not a wait for something: scrapes meanwhile share this one
                time.sleep(pause)
            self.began = time.monotonic()
            self.body = generate_latest(self.registry)
            return self.body


def make_handler(renderer: Renderer) -> type[BaseHTTPRequestHandler]:
    """A handler answering ``GET /metrics`` (421 to a Host not this server's, 404 elsewhere,
    501 to other methods, by the base class)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "blizzard-metrics"
        timeout = IDLE_TIMEOUT_S  # of each read and write on the connection
        server: GuardedHTTPServer

        def do_GET(self) -> None:
            came = time.monotonic()
            if not self.server.answers_to(self.headers.get("Host")):
                log.info("refused a scrape for Host %r", self.headers.get("Host", "")[:100])
                self._send(HTTPStatus.MISDIRECTED_REQUEST,
                           b"this endpoint answers only to its own address, localhost, an IP "
                           b"address or a name given with --metrics-allow-host\n",
                           "text/plain; charset=utf-8")
            elif urlsplit(self.path).path == PATH:
                self._send(HTTPStatus.OK, renderer.body_for(came), CONTENT_TYPE_LATEST)
            else:
                self._send(HTTPStatus.NOT_FOUND, b"not found: the metrics are at /metrics\n",
                           "text/plain; charset=utf-8")

        def _send(self, code: HTTPStatus, body: bytes, kind: str) -> None:
            respond(self, code, body, kind)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


class MetricsUnavailable(OSError):
    """Raised when the metrics endpoint cannot listen on its address and port."""


class Endpoint:
    """``/metrics`` of one registry, served over HTTP from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str,
                 allow_hosts: Iterable[str] = ()) -> None:
        try:
            self._httpd = GuardedHTTPServer((addr, port), make_handler(Renderer(registry)),
                                            allow_hosts, MAX_SCRAPES, CONNECTION_S, any_ip=True)
        except OSError as exc:
            raise MetricsUnavailable(f"cannot serve metrics on {addr}:{port}: "
                                     f"{exc.strerror or exc}") from None
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        name="metrics")
        self._thread.start()
        self.url = f"http://{addr}:{self.port}{PATH}"
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
            self.endpoint = Endpoint(self.registry, config.metrics_port, config.metrics_addr,
                                     getattr(config, "metrics_allow_hosts", ()))

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
