"""A process that had a large payload refused exits cleanly, every time.

An enqueue over the master's max item size is refused (``PayloadTooLarge``) while its payload may
still be on its way to the data nodes. When libzmq's I/O thread read that payload from a Python
object (a zero-copy send), the interpreter could free it first at exit: a segfault in about 4 runs
of 10 of a program that caught the error (the CLI too, before it refused such a file itself). Sends
now copy into libzmq's buffer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

RUNS = 50

PROGRAM = """
import sys
from blizzard import Client, PayloadTooLarge
c = Client(sys.argv[1])
try:
    c.enqueue("big", bytes(int(sys.argv[2])))
except PayloadTooLarge:
    sys.exit(7)
sys.exit(1)
"""


def test_fifty_refused_large_enqueues_exit_without_a_crash(cluster):
    env = dict(os.environ, BLIZZARD_MASTER=cluster.master_addr)

    def run(i: int) -> tuple[int, bytes]:
        # over the master's limit (8 MiB), under the largest any master allows (16 MiB, which
        # the client refuses itself before sending anything): the payload goes out
        size = 10 * 1024 * 1024
        proc = subprocess.run([sys.executable, "-c", PROGRAM, cluster.master_addr, str(size)],
                              capture_output=True, env=env, timeout=120)
        return proc.returncode, proc.stderr

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(RUNS)))
    crashed = [(rc, err[-300:]) for rc, err in results if rc != 7]
    assert not crashed, f"{len(crashed)} of {RUNS} runs did not exit cleanly: {crashed[:3]}"
