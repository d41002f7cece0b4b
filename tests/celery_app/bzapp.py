"""A Celery app whose broker is ``blizzard sqs``, through kombu's own SQS transport, for
tests/test_celery.py. Its settings come from the environment the test gives the worker and
itself: ``BZ_BROKER`` (``sqs://KEY:SECRET@127.0.0.1:PORT``), ``BZ_OUT`` (the file each task
run appends a line to), ``BZ_VISIBILITY_S`` and ``BZ_SLOW_S``."""

from __future__ import annotations

import os
import time

from celery import Celery

app = Celery("bzapp", broker=os.environ["BZ_BROKER"])
app.conf.update(
    broker_transport_options={"region": "us-east-1", "is_secure": False,
                              "visibility_timeout": int(os.environ.get("BZ_VISIBILITY_S", "30")),
                              "polling_interval": 0.2, "wait_time_seconds": 1},
    task_acks_late=True, worker_prefetch_multiplier=1, task_default_queue="bz-celery",
    broker_connection_retry_on_startup=True, worker_hijack_root_logger=False)


def record(line: str) -> None:
    with open(os.environ["BZ_OUT"], "a") as f:  # one short line per write: appended whole
        f.write(line + "\n")


@app.task
def work(n: int) -> None:
    record(f"ran {n}")


@app.task(bind=True, max_retries=3)
def flaky(self, n: int) -> None:  # type: ignore[no-untyped-def]
    record(f"try {n} {self.request.retries}")
    if self.request.retries < 1:
        raise self.retry(countdown=1)


@app.task
def later(n: int, sent_at: float) -> None:
    record(f"later {n} {time.time() - sent_at:.2f}")


@app.task
def slow(n: int) -> None:
    record(f"slow-start {n}")
    time.sleep(float(os.environ.get("BZ_SLOW_S", "0")))  # the first worker is killed meanwhile
    record(f"slow-done {n}")
