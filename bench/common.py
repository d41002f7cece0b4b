"""What the benchmarks share: progress logging on stderr, SIGTERM as an exit, a scratch dir,
the clusters to compare (security on/off, metrics on/off), and running a measurement on clusters
that are stopped (their logs kept on failure) after."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from blizzard.local.harness import AUTO_KEYS, LocalCluster

log = logging.getLogger(__name__)


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser that shows the benchmark's module docstring as its help."""
    return argparse.ArgumentParser(prog=prog, description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def int_list(text: str) -> list[int]:
    """``"256,4096"`` -> ``[256, 4096]``."""
    return [int(x) for x in text.split(",") if x.strip()]


def security_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--security", choices=["on", "off", "both"], default="on",
                    help="CURVE keys on every socket (on, the default), --insecure (off), or "
                         "both: two clusters measured in turn, each line tagged")


def metrics_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--metrics", choices=["on", "off", "both"], default="off",
                    help="Prometheus metrics served by every process and scraped every "
                         f"{SCRAPE_S:g} s (on), not served (off, the default), or both: "
                         "clusters measured in turn, each line tagged")


def clusters_for(base: str, security: str, metrics: str = "off",
                 **kw: Any) -> list[LocalCluster]:
    """One cluster per combination of the security and metrics settings asked for (``on``
    first), each in its own dir."""
    import os
    secure = ["on", "off"] if security == "both" else [security]
    served = ["on", "off"] if metrics == "both" else [metrics]
    return [LocalCluster(os.path.join(base, f"security-{s}-metrics-{m}"),
                         keys=None if s == "off" else AUTO_KEYS, metrics=m == "on", **kw)
            for s in secure for m in served]


def metrics_of(cluster: LocalCluster) -> str:
    return "on" if cluster.metrics else "off"


SCRAPE_S = 1.0  # far more often than Prometheus's usual 15 s: an upper bound of the cost


class Scraper:
    """Scrapes every ``/metrics`` of the clusters serving them, every ``SCRAPE_S``, in a
    thread, as Prometheus would: the servers pay for their scrapes during the measurement."""

    def __init__(self, clusters: Sequence[LocalCluster]) -> None:
        self.urls = [c.metrics_url(name) for c in clusters for name in c.metrics_ports]
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        if self.urls:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.urls:
            log.info("%d scrapes of %d metrics endpoints", self.scrapes, len(self.urls))

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_S):
            for url in self.urls:
                try:
                    with urllib.request.urlopen(url, timeout=5) as reply:
                        reply.read()
                    self.scrapes += 1
                except OSError as exc:
                    log.warning("scraping %s failed: %s", url, exc)


def client_keys(cluster: LocalCluster) -> str:
    """What a worker passes as ``Client(keys=...)``: the directory, or "" for none."""
    return cluster.keys or ""


def security_of(cluster: LocalCluster) -> str:
    return "off" if cluster.keys is None else "on"


NO_SYNC_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "no_sync_site")
NO_SYNC_NOTICE = "BLIZZARD_BENCH_NO_SYNC=1"  # how a server unsynced so begins its log


def no_sync_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-sync", action="store_true",
                    help="UNSAFE, an estimate: the servers skip their fsyncs and synced "
                         "LevelDB writes (bench/no_sync_site), to see what a change in where or "
                         "when they sync could win; the lines are tagged")


def unsafe_no_sync() -> None:
    """The servers started from now on by this process skip their syncs (see
    ``bench/no_sync_site``); never a way to run Blizzard. Their passes still hold for one
    another's callers as configured (``--sync-hold-ms``): the hold shares syncs, and also
    gathers put reports into fewer messages."""
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [NO_SYNC_SITE, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["BLIZZARD_BENCH_NO_SYNC"] = "1"


def start(tag: str) -> str:
    """Set up a benchmark process: log progress as ``[tag time] ...``, let SIGTERM unwind
    (so ``finally`` blocks stop clusters), and return a fresh scratch dir under /tmp."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"[{tag} %(asctime)s] %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("pika").setLevel(logging.WARNING)  # a peer's client: its every connect

    def term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, term)
    return tempfile.mkdtemp(prefix=f"blizzard-{tag}-", dir="/tmp")


def on_clusters(base: str, clusters: Sequence[LocalCluster], body: Callable[[], int],
                scrape: bool = True) -> int:
    """Start ``clusters``, run ``body`` (it returns an exit code), stop them whatever happens.
    Those serving metrics are scraped meanwhile as Prometheus would, unless not ``scrape``.

    Ctrl-C gives 130; an exception is logged with the clusters' logs and gives 1. The scratch
    dir ``base`` is removed after a clean run and kept, with the logs, after a failure.
    """
    rc = 0
    try:
        for cluster in clusters:
            cluster.start()
        with Scraper(clusters if scrape else []):
            rc = body()
    except KeyboardInterrupt:
        log.info("interrupted; stopping the cluster")
        rc = 130
    except Exception:
        log.exception("benchmark failed; cluster logs:\n%s", "\n".join(c.logs() for c in clusters))
        rc = 1
    finally:
        for cluster in clusters:
            cluster.stop()
        if rc in (0, 130):
            shutil.rmtree(base, ignore_errors=True)
        else:
            log.info("cluster logs kept in %s", base)
    return rc
