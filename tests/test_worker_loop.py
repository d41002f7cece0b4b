"""The worker's loop against a scripted stand-in for the cluster: lost leases, a master that
does not answer, the acks of a graceful stop (``tests/test_worker.py`` runs real processes)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from blizzard.client.message import Message
from blizzard.wire import protocol as p
from blizzard.wire.errors import LeaseExpired, MasterUnavailable, TooManyItems
from blizzard.worker.loop import Prefetch, Worker, WorkerConfig
from blizzard.worker.task import Task, encode_call

WAIT_S = 5.0  # a job waits at most this long for what the test makes the loop do


class FakeLeases:
    """The ``client.leases`` part the worker uses: acks sent without waiting, their flush."""

    def __init__(self) -> None:
        self.unawaited: list[list[int]] = []
        self.flushes = 0

    def ack_unawaited(self, msgs: list[Message]) -> None:
        self.unawaited.append([m.id for m in msgs])

    def flush(self, timeout_s: float) -> None:
        self.flushes += 1


class FakeClient:
    """Hands out scripted jobs; records every settling call; ``lost`` ids had lost their
    leases (settling them raises ``LeaseExpired``, as the master reports it)."""

    def __init__(self, jobs: list[tuple[str, bytes]], lease_s: dict[str, float]) -> None:
        self.waiting = [Message(i, data, queue, 0, 0, 0.0, 1, None) for i, (queue, data)
                        in enumerate(jobs, 1)]
        self.lease_s = lease_s
        self.timeout_s = 1.0
        self.lost: set[int] = set()
        self.extend_error: Exception | None = None
        self.ack_error: Exception | None = None
        self.lease_error: Exception | None = None  # raised once, by the first lease with acks
        self.riders: list[list[int]] = []  # the acks carried by each lease
        self.extends: list[tuple[float, list[int]]] = []
        self.nacks: list[list[int]] = []
        self.acks: list[list[int]] = []
        self.buried: list[list[int]] = []
        self.results: list[tuple[str, list[int], int]] = []  # stored: (queue, jobs, kind)
        self.extended = threading.Event()
        self.leases = FakeLeases()
        self.master = self  # ``bury`` calls ``client.master.call``

    def queue_config(self, queue: str) -> dict[str, Any]:
        return {"lease_s": self.lease_s[queue], "max_attempts": 3}

    def dequeue_many(self, queue: str, n: int, *, lease_s: float, wait_s: float,
                     ack: list[Message]) -> list[Message]:
        self.riders.append([m.id for m in ack])
        if ack and self.lease_error is not None:
            error, self.lease_error = self.lease_error, None
            raise error
        got = [m for m in self.waiting if m.queue == queue][:n]
        self.waiting = [m for m in self.waiting if m not in got]
        if self.lost & {m.id for m in ack}:  # as Leases.lease: the new jobs go back
            self.waiting += got
            raise LeaseExpired("an ack that rode on the lease was lost")
        return got

    def extend_many(self, msgs: list[Message], *, lease_s: float,
                    progress: dict | None = None) -> list[int]:
        self.extends.append((time.monotonic(), [m.id for m in msgs]))
        self.extended.set()
        if self.extend_error is not None:
            raise self.extend_error
        return []

    def store_results(self, queue: str, jobs: list[int], blobs: list[bytes], *, kind: int,
                      ttl_s: float) -> list[int]:
        self.results.append((queue, [m.id for m in jobs], kind))
        return [m.id for m in jobs]

    def _settle(self, calls: list[list[int]], msgs: list[Message]) -> None:
        calls.append([m.id for m in msgs])
        if self.lost & {m.id for m in msgs}:
            raise LeaseExpired(f"items {sorted(self.lost)} are no longer leased")

    def nack_many(self, msgs: list[Message], *, delay_s: float | None, error: str) -> None:
        self._settle(self.nacks, msgs)

    def ack_many(self, msgs: list[Message]) -> None:
        self._settle(self.acks, msgs)
        if self.ack_error is not None:
            raise self.ack_error

    def call(self, request: p.Bury) -> p.Acked:
        self.buried.append(list(request.ids))
        return p.Acked(0, [i for i in request.ids if i in self.lost])


def job(name: str, queue: str = "q") -> tuple[str, bytes]:
    return queue, encode_call(name, [], {})


def run_worker(client: FakeClient, tasks: dict[str, Any], *queues: str,
               concurrency: int = 2) -> Worker:
    worker = Worker(client, {name: Task(fn, "q", name, {}) for name, fn in tasks.items()},
                    WorkerConfig(queues or ("q",), concurrency, burst=True))
    worker.run()
    return worker


def job_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("job-") and t.is_alive()]


def test_a_job_that_lost_its_lease_and_failed_is_logged_and_the_worker_goes_on():
    # Given a job whose extension reported its lease lost, and a job on a long lease
    client = FakeClient([job("fail_late", "short"), job("fail_late", "long"), job("ok", "long")],
                        {"short": 0.3, "long": 60.0})
    client.extend_error = LeaseExpired("items [1] are no longer leased")
    client.lost = {1}

    def fail_late() -> None:
        client.extended.wait(WAIT_S)
        raise ValueError("late")
    # When both fail (the lost one's nack raising LeaseExpired)
    worker = run_worker(client, {"fail_late": fail_late, "ok": lambda: None}, "short", "long",
                        concurrency=3)
    # Then the worker finished every job, and the lost job was nacked on its own
    assert (worker.succeeded, worker.failed) == (1, 2)
    assert sorted(client.nacks) == [[1], [2]]
    assert 3 in [i for ids in client.riders + client.acks + client.leases.unawaited for i in ids]


def test_a_lost_lease_on_a_burial_is_logged_and_the_worker_goes_on():
    client = FakeClient([("q", b"not a task call"), job("ok")], {"q": 30.0})
    client.lost = {1}
    worker = run_worker(client, {"ok": lambda: None})
    assert client.buried == [[1]] and worker.succeeded == 1


def test_a_failed_extension_keeps_its_deadline_retries_soon_and_its_ack_never_rides():
    # Given a master that does not answer extensions
    client = FakeClient([job("waits"), job("ok")], {"q": 1.2})
    client.extend_error = MasterUnavailable("no answer")

    def waits() -> None:  # until the extension failed and was tried again
        deadline = time.monotonic() + WAIT_S
        while len(client.extends) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    # When the job ends after its lease may have run out
    run_worker(client, {"waits": waits, "ok": lambda: None}, concurrency=1)
    # Then the extension was tried again well before a new lease's third was up (0.8 s) ...
    (first, _), (second, _) = client.extends[:2]
    assert second - first < 0.5
    # ... and the ack of the job whose lease was in doubt did not ride on a lease
    assert all(1 not in ids for ids in client.riders)
    assert [1] in client.leases.unawaited + client.acks


def test_the_acks_of_a_lease_the_master_did_not_answer_are_sent_again_alone():
    client = FakeClient([job("ok"), job("ok")], {"q": 30.0})
    client.lease_error = MasterUnavailable("no answer")
    run_worker(client, {"ok": lambda: None}, concurrency=1)
    first = next(ids for ids in client.riders if ids)
    assert first == [1] and [1] in client.leases.unawaited
    assert sum(1 in ids for ids in client.riders) == 1


@pytest.mark.parametrize("error", [LeaseExpired("items [1] are no longer leased"),
                                   MasterUnavailable("no answer")])
def test_a_graceful_stop_waits_for_its_acks_and_survives_their_failure(error):
    # Given a job that stops the worker while it runs
    client = FakeClient([job("stops")], {"q": 30.0})
    client.ack_error = error
    worker: list[Worker] = []

    def stops() -> None:
        worker[0].stop()
    worker.append(Worker(client, {"stops": Task(stops, "q", "stops", {})},
                         WorkerConfig(("q",), 1)))
    before = set(job_threads())
    # When the final, waiting ack fails
    worker[0].run()
    # Then the ack was waited for (not sent unanswered), the failure did not escape, the
    # quiet acks sent before were flushed, and the job threads were stopped
    assert client.acks == [[1]] and client.leases.unawaited == []
    assert client.leases.flushes == 1
    assert not set(job_threads()) - before


def test_the_prefetch_holds_about_64_mib_of_payloads_by_the_recent_item_size():
    pre = Prefetch(8, buffer_s=0.1, cap=2000, cap_bytes=64 << 20)
    for _ in range(50):
        pre.record(0.000001)
    assert pre.target() == 2000  # no-op jobs, no sizes known yet: capped by count
    pre.record_sizes([1 << 20] * 100)
    assert pre.target() == 64  # 1 MiB payloads
    pre.record_sizes([100] * 100)
    assert pre.target() == 2000  # small again: the count bounds it


class SlotsFullClient(FakeClient):
    """A master whose long-poll slots are all taken: a lease that would park is refused."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.refused = 0

    def dequeue_many(self, queue: str, n: int, *, lease_s: float, wait_s: float,
                     ack: list[Message]) -> list[Message]:
        if wait_s > 0:
            self.refused += 1
            raise TooManyItems("too many long polls waiting: this key's connections have "
                               "2000 long polls waiting")
        return super().dequeue_many(queue, n, lease_s=lease_s, wait_s=wait_s, ack=ack)


def test_a_worker_whose_long_polls_are_refused_polls_instead_and_keeps_working():
    """Another holder of the same client key may take every long-poll slot the key has: the
    worker must not exit, and must still run the jobs that come (at a long poll's pace)."""
    client = SlotsFullClient([], {"q": 60.0})
    done = threading.Event()
    worker = Worker(client, {"ok": Task(lambda: done.set(), "q", "ok", {})},
                    WorkerConfig(("q",), 1, burst=False))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while client.refused < 2:  # idle: it asked to park, was refused, polled, and again
        assert time.monotonic() < deadline and thread.is_alive(), "the worker stopped"
        time.sleep(0.01)
    client.waiting.append(Message(7, encode_call("ok", [], {}), "q", 0, 0, 0.0, 1, None))
    assert done.wait(WAIT_S), "the job that came was never run"
    worker.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive() and worker.succeeded == 1
    assert client.refused < 20  # paced like a long poll, not a busy loop
