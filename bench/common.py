"""What the benchmarks share: progress logging on stderr, SIGTERM as an exit, a scratch dir."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
from typing import Any


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """An argument parser that shows the benchmark's module docstring as its help."""
    return argparse.ArgumentParser(prog=prog, description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def int_list(text: str) -> list[int]:
    """``"256,4096"`` -> ``[256, 4096]``."""
    return [int(x) for x in text.split(",") if x.strip()]


def start(tag: str) -> str:
    """Set up a benchmark process: log progress as ``[tag time] ...``, let SIGTERM unwind
    (so ``finally`` blocks stop clusters), and return a fresh scratch dir under /tmp."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"[{tag} %(asctime)s] %(message)s", datefmt="%H:%M:%S")

    def term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, term)
    return tempfile.mkdtemp(prefix=f"blizzard-{tag}-", dir="/tmp")
