"""The demo's worker step: calls enqueued with ``@task`` run in a real ``blizzard worker``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import click

from blizzard import Client, task

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = 1000


@task(queue="demo-jobs", max_attempts=3)
def square(n: int, out: str) -> None:
    """A job: write n squared into a file of its own under ``out``."""
    with open(os.path.join(out, f"{n:06d}"), "w") as f:
        f.write(str(n * n))


def worker_step(master: str, jobs: int = JOBS) -> str:
    """Enqueue ``jobs`` calls of ``square``, run them with ``blizzard worker --burst``, check
    every result and the empty queue; one line saying so."""
    with tempfile.TemporaryDirectory(prefix="blizzard-jobs-") as out, Client(master) as c:
        square.with_options(client=c).enqueue_many([(n, out) for n in range(jobs)])
        command = ["blizzard", "worker", "worker_demo", "--burst", "--concurrency", "4"]
        click.echo(f"worker: {jobs} jobs enqueued; running `{' '.join(command)}`")
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "blizzard.cli", *command[1:], "--master",
                               master, "--log-level", "warning"], cwd=HERE, timeout=300,
                              capture_output=True, text=True)
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            raise click.ClickException(f"the worker exited {proc.returncode}: {proc.stderr}")
        results = {name: open(os.path.join(out, name)).read() for name in os.listdir(out)}
        stats = c.stats("demo-jobs")
    if results != {f"{n:06d}": str(n * n) for n in range(jobs)} or stats["ready"] \
            or stats["leased"]:
        raise click.ClickException(f"worker: {len(results)} of {jobs} jobs ran right; "
                                   f"queue after: {stats}")
    return (f"worker: all {jobs} jobs ran and were acked in {elapsed:.1f}s (process start "
            "included); queue empty")
