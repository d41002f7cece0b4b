"""What the benchmarks share: progress logging on stderr, SIGTERM as an exit, a scratch dir,
and running a measurement on clusters that are stopped (their logs kept on failure) after."""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
import tempfile
from typing import Any, Callable, Sequence

from blizzard.harness import AUTO_KEYS, LocalCluster

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


def clusters_for(base: str, security: str, **kw: Any) -> list[LocalCluster]:
    """One cluster per security setting asked for (``on`` first), each in its own dir."""
    import os
    settings = ["on", "off"] if security == "both" else [security]
    return [LocalCluster(os.path.join(base, s), keys=None if s == "off" else AUTO_KEYS, **kw)
            for s in settings]


def client_keys(cluster: LocalCluster) -> str:
    """What a worker passes as ``Client(keys=...)``: the directory, or "" for none."""
    return cluster.keys or ""


def security_of(cluster: LocalCluster) -> str:
    return "off" if cluster.keys is None else "on"


def start(tag: str) -> str:
    """Set up a benchmark process: log progress as ``[tag time] ...``, let SIGTERM unwind
    (so ``finally`` blocks stop clusters), and return a fresh scratch dir under /tmp."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"[{tag} %(asctime)s] %(message)s", datefmt="%H:%M:%S")

    def term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, term)
    return tempfile.mkdtemp(prefix=f"blizzard-{tag}-", dir="/tmp")


def on_clusters(base: str, clusters: Sequence[LocalCluster], body: Callable[[], int]) -> int:
    """Start ``clusters``, run ``body`` (it returns an exit code), stop them whatever happens.

    Ctrl-C gives 130; an exception is logged with the clusters' logs and gives 1. The scratch
    dir ``base`` is removed after a clean run and kept, with the logs, after a failure.
    """
    rc = 0
    try:
        for cluster in clusters:
            cluster.start()
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
