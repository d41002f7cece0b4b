"""Several threads of one test at once: started together, all waited for."""

from __future__ import annotations

import threading
from collections.abc import Callable


def in_threads(target: Callable[[int], None], n: int, timeout_s: float = 60.0) -> None:
    """Run ``target(k)`` for k in 0..n-1, each in a thread of its own; return when all ended
    (or ``timeout_s`` passed for each)."""
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
