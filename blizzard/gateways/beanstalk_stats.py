"""The counters of ``blizzard beanstalkd`` that beanstalkd keeps and the cluster does not: the
commands served, the jobs put, each tube's deletes and pauses, each job's reserves, releases,
buries and kicks. Kept by the gateway, since it started (beanstalkd's are since the server
started; a job's are those this gateway saw, so another gateway's releases are not in them).
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict

# beanstalkd 1.12's command counters, in the order its ``stats`` lists them
COMMANDS = ("put", "peek", "peek-ready", "peek-delayed", "peek-buried", "reserve",
            "reserve-with-timeout", "delete", "release", "use", "watch", "ignore", "bury", "kick",
            "touch", "stats", "stats-job", "stats-tube", "list-tubes", "list-tube-used",
            "list-tubes-watched", "pause-tube")
MAX_JOBS = 100_000  # jobs whose counters are kept (the oldest seen first forgotten)
JOB_COUNTERS = ("reserves", "releases", "buries", "kicks")


class GatewayCounters:
    """What the gateway's connections did, for ``stats``, ``stats-tube`` and ``stats-job``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.commands: Counter[str] = Counter()
        self.total_jobs = 0
        self.tube_jobs: Counter[str] = Counter()
        self.tube_deletes: Counter[str] = Counter()
        self.tube_pauses: Counter[str] = Counter()
        self.jobs: OrderedDict[int, Counter[str]] = OrderedDict()

    def command(self, name: str) -> None:
        with self.lock:
            self.commands[name] += 1

    def put(self, tube: str) -> None:
        with self.lock:
            self.total_jobs += 1
            self.tube_jobs[tube] += 1

    def deleted(self, tube: str) -> None:
        with self.lock:
            self.tube_deletes[tube] += 1

    def paused(self, tube: str) -> None:
        with self.lock:
            self.tube_pauses[tube] += 1

    def job(self, job: int, counter: str) -> None:
        """One more of ``counter`` (a name in ``JOB_COUNTERS``) for ``job``."""
        with self.lock:
            seen = self.jobs.get(job)
            if seen is None:
                if len(self.jobs) >= MAX_JOBS:
                    self.jobs.popitem(last=False)
                seen = self.jobs[job] = Counter()
            seen[counter] += 1

    def of_job(self, job: int) -> Counter[str] | None:
        """The counters of ``job`` (None: this gateway saw nothing of it)."""
        with self.lock:
            seen = self.jobs.get(job)
            return Counter(seen) if seen is not None else None

    def forget_job(self, job: int) -> None:
        with self.lock:
            self.jobs.pop(job, None)
