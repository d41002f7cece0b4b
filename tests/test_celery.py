"""Celery on Blizzard: a real Celery worker (``celery[sqs]``, kombu's own SQS transport) with
``blizzard sqs`` as its broker, signed with the gateway's credentials. Tasks each run once, a
retry runs again, a countdown waits, a worker killed with SIGKILL mid-task leaves its task to
run again once the visibility timeout passes (acks late), and a warm shutdown leaves the
queue empty. docs/celery.md has the settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from support.sqs import KEYS, boto, gateway_on_new_cluster
from support.wait import wait_for

pytestmark = pytest.mark.cluster
APP_DIR = os.path.join(os.path.dirname(__file__), "celery_app")
VISIBILITY_S = 3


@pytest.fixture
def gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path)


def lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().splitlines()


def test_a_celery_worker_runs_its_tasks_through_the_sqs_gateway(gateway, tmp_path, monkeypatch):
    out = str(tmp_path / "runs.txt")
    key, secret = KEYS["client"]
    env = {"BZ_BROKER": f"sqs://{key}:{secret}@127.0.0.1:{gateway.port}", "BZ_OUT": out,
           "BZ_VISIBILITY_S": str(VISIBILITY_S)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(APP_DIR)
    import bzapp

    def worker(**more: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bzapp", "worker", "--pool", "solo",
             "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning"],
            cwd=APP_DIR, env=dict(os.environ, **env, **more), stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "worker.log", "ab"))

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n in range(60):
            bzapp.work.delay(n)
        bzapp.flaky.delay(1)
        bzapp.later.apply_async((1, time.time()), countdown=2)
        procs.append(worker())
        wait_for(lambda: len([x for x in lines(out) if x.startswith("ran ")]) >= 60
                 and any(x.startswith("later ") for x in lines(out))
                 and "try 1 1" in lines(out), timeout_s=120, what="the tasks to run")
        runs = Counter(x for x in lines(out) if x.startswith("ran "))
        assert runs == Counter({f"ran {n}": 1 for n in range(60)})  # each once
        assert [x for x in lines(out) if x.startswith("try ")] == ["try 1 0", "try 1 1"]
        waited = float(next(x for x in lines(out) if x.startswith("later ")).split()[2])
        assert waited >= 1.9  # the countdown, from the send
        # a task under way when its worker is killed runs again after the visibility timeout
        procs[0].terminate()  # a warm shutdown first: nothing under way, nothing left behind
        assert procs[0].wait(60) == 0
        bzapp.slow.delay(7)
        procs.append(worker(BZ_SLOW_S="120"))
        wait_for(lambda: "slow-start 7" in lines(out), timeout_s=60, what="the slow task")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(30)
        procs.append(worker(BZ_SLOW_S="0"))
        wait_for(lambda: "slow-done 7" in lines(out), timeout_s=60 + VISIBILITY_S,
                 what="the killed worker's task to run again")
        assert lines(out).count("slow-start 7") == 2 and lines(out).count("slow-done 7") == 1
        procs[2].terminate()  # warm shutdown: the queue is left empty
        assert procs[2].wait(60) == 0
        sqs = boto(gateway.url)
        url = sqs.get_queue_url(QueueName="bz-celery")["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
        assert attrs == {"ApproximateNumberOfMessages": "0",
                         "ApproximateNumberOfMessagesNotVisible": "0"}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
