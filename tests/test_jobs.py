"""Jobs as their producers see them, against a real cluster and a real ``blizzard worker``:
results kept (replicated, through a master kill -9 and a data node's loss) and running out,
failures and their errors, cancellation of queued and running jobs, progress handed to a
retry, a job run twice, ``blizzard job`` and ``blizzard cancel``."""

from __future__ import annotations

import json

import pytest

from blizzard import Client, JobCancelled, JobFailed, JobHandle, ResultUnavailable, group
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument, LeaseExpired, TooManyItems
from blizzard.worker.results import decode_result, encode_result
from blizzard.worker.task import task

from support.cli import output
from support.wait import wait_for
from support.worker_proc import running_worker

pytestmark = pytest.mark.cluster

JOBS = '''
import os, pathlib, time
import blizzard
from blizzard.worker.task import task

OUT = pathlib.Path(os.environ["JOBS_OUT"])

@task(queue="math", max_attempts=2, backoff_base_s=0.0)
def add(x, y):
    return {"sum": x + y}

@task(queue="math", max_attempts=2, backoff_base_s=0.0)
def explode(tag):
    raise ValueError(f"cannot {tag}")

@task(queue="math", result_ttl_s=1.0)
def brief(x):
    return x

@task(queue="long", lease_s=1.5, max_attempts=3, backoff_base_s=0.0)
def loop_until_cancelled(tag):
    (OUT / f"started-{tag}").write_text("")
    try:
        while True:
            blizzard.cancelled()  # the safe point
            time.sleep(0.02)
    finally:
        (OUT / f"stopped-{tag}").write_text("")

@task(queue="long", lease_s=1.5, max_attempts=3, backoff_base_s=0.0)
def ignore_cancel(tag):
    (OUT / f"started-{tag}").write_text("")
    while not (OUT / f"go-{tag}").exists():
        time.sleep(0.02)
    return 7

@task(queue="long", lease_s=1.5, max_attempts=3, backoff_base_s=0.0)
def resumable(tag):
    saved = blizzard.last_state()
    if saved is not None:
        return {"resumed_from": saved, "attempt": blizzard.current_job().attempts + 1}
    blizzard.progress(0.5, note="halfway", state={"step": 5})
    while not (OUT / f"fail-{tag}").exists():
        time.sleep(0.02)
    raise RuntimeError("lost the connection halfway")

@task(queue="flow", max_attempts=1)
def step(tag, fail=False):
    (OUT / f"ran-{tag}").write_text(str(time.time()))
    if fail:
        raise RuntimeError(f"step {tag} failed")
    return tag

@task(queue="flow")
def report(label):
    return [label, time.time()]
'''


# stand-ins of the same names: enqueue needs only the name and the queue
@task(queue="math", max_attempts=2, backoff_base_s=0.0)
def add(x: int, y: int) -> dict: ...


@task(queue="math", max_attempts=2, backoff_base_s=0.0)
def explode(tag: str) -> None: ...


@task(queue="math", result_ttl_s=1.0)
def brief(x: int) -> int: ...


@task(queue="long", lease_s=1.5, max_attempts=3, backoff_base_s=0.0)
def loop_until_cancelled(tag: str) -> None: ...


@task(queue="long", lease_s=1.5, max_attempts=3, backoff_base_s=0.0)
def ignore_cancel(tag: str) -> int: ...


@task(queue="long", lease_s=1.5, max_attempts=3, backoff_base_s=0.0)
def resumable(tag: str) -> dict: ...


@task(queue="flow", max_attempts=1)
def step(tag: str, fail: bool = False) -> str: ...


@task(queue="flow")
def report(label: str) -> list: ...


@pytest.fixture
def jobs_dir(tmp_path):
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "out").mkdir()
    return tmp_path


@pytest.fixture
def worker(cluster, jobs_dir):
    with running_worker(jobs_dir, cluster.master_addr, "--concurrency", "4") as proc:
        yield proc


def test_a_result_comes_back_and_a_failure_says_why(cluster, worker):
    with Client(cluster.master_addr) as c:
        handle = add.with_options(client=c).enqueue(2, 3)
        failing = explode.with_options(client=c).enqueue("divide")
        assert handle.result(timeout_s=30) == {"sum": 5}
        assert handle.status() == "done"
        info = handle.info()
        assert (info.runs, info.attempts, info.cancel_requested) == (1, 0, False)
        with pytest.raises(JobFailed) as failed:
            failing.result(timeout_s=30)
        assert "ValueError: cannot divide" in failed.value.error
        assert failing.status() == "dead"
        assert not failing.cancel()  # a dead job is final: nothing to cancel
        shown = json.loads(output(cluster.master_addr, "job", str(handle.id), "--json"))["jobs"][0]
        assert shown["state"] == "done" and shown["result"] == {"sum": 5}
        text = output(cluster.master_addr, "job", str(failing.id))
        assert f"job {failing.id}: dead" in text and "cannot divide" in text


def test_results_survive_a_master_kill_and_a_data_nodes_loss_and_run_out_after_their_ttl(
        cluster, worker):
    with Client(cluster.master_addr) as c:
        kept = add.with_options(client=c).enqueue(20, 22)
        assert kept.result(timeout_s=30) == {"sum": 42}
        short = brief.with_options(client=c).enqueue(9)
        assert short.result(timeout_s=30) == 9
    cluster.master.kill()  # kill -9: the links are in the WAL
    cluster.restart_master()
    with Client(cluster.master_addr) as c:
        item = c.jobs([kept.id])[0]
        assert item.state == "done" and decode_result(item.result).value == {"sum": 42}
        # lose a data node that holds it: the result is replicated (R=2), the other serves it
        results = c.master.call(p.Jobs([kept.id])).results
        holders = {ref.addr for ref in results.replica_sets[results.replica_set[0]].nodes}
        assert len(holders) == 2
        next(n for n in cluster.nodes if n.addr in holders).kill()
        assert decode_result(c.jobs([kept.id])[0].result).value == {"sum": 42}
        # the short-lived result runs out (a second's time to live) and its item goes
        wait_for(lambda: c.jobs([short.id])[0].result is None, 20, "the result to run out")
        with pytest.raises(ResultUnavailable):
            JobHandle(short.id, "math", lambda: c).result(timeout_s=1)
        wait_for(lambda: c.stats("math.results")["delayed"] == 1, 10, "its item to go")


def test_a_queued_job_cancelled_never_runs(cluster, worker, jobs_dir):
    with Client(cluster.master_addr) as c:
        later = add.with_options(client=c, delay_s=60).enqueue(1, 1)
        assert later.status() == "delayed"
        assert later.cancel()
        assert later.status() == "cancelled"
        with pytest.raises(JobCancelled):
            later.result(timeout_s=5)
        assert c.stats("math")["delayed"] == 0
        text = output(cluster.master_addr, "cancel", str(later.id), "123456789")
        assert f"job {later.id}: not cancelled" in text and "job 123456789: not" in text


def test_a_running_job_stops_at_its_next_check_when_cancelled(cluster, worker, jobs_dir):
    out = jobs_dir / "out"
    with Client(cluster.master_addr) as c:
        job = loop_until_cancelled.with_options(client=c).enqueue("a")
        wait_for(lambda: (out / "started-a").exists(), 20, "the job to start")
        assert job.status() == "running"
        assert "cancelled" in output(cluster.master_addr, "cancel", str(job.id))
        info = job.info()
        assert info.state == "running" and info.cancel_requested  # until its worker hears
        with pytest.raises(JobCancelled):
            job.result(timeout_s=20)  # told on the next extension (every second here)
        assert (out / "stopped-a").exists()
        assert job.status() == "cancelled"


def test_a_job_that_finishes_anyway_keeps_its_result_shown_as_cancel_requested(
        cluster, worker, jobs_dir):
    out = jobs_dir / "out"
    with Client(cluster.master_addr) as c:
        job = ignore_cancel.with_options(client=c).enqueue("b")
        wait_for(lambda: (out / "started-b").exists(), 20, "the job to start")
        assert job.cancel()
        (out / "go-b").write_text("")
        assert job.result(timeout_s=20) == 7
        info = job.info()
        assert info.state == "done" and info.cancel_requested
        assert "(cancel requested)" in output(cluster.master_addr, "job", str(job.id))


def test_progress_is_shown_and_its_state_is_handed_to_the_retry(cluster, worker, jobs_dir):
    out = jobs_dir / "out"
    with Client(cluster.master_addr) as c:
        job = resumable.with_options(client=c).enqueue("c")
        seen = wait_for(lambda: (lambda s: s if s.progress == 0.5 else None)(job.status()), 20,
                        "the progress to show")
        assert seen == "running" and seen.note == "halfway"  # the state, with its progress
        assert "progress: 50% (halfway)" in output(cluster.master_addr, "job", str(job.id))
        (out / "fail-c").write_text("")  # the first attempt fails; the retry resumes
        assert job.result(timeout_s=30) == {"resumed_from": {"step": 5}, "attempt": 2}


def test_a_job_run_twice_keeps_its_last_result_and_says_so(cluster):
    with Client(cluster.master_addr) as c:
        job = c.enqueue("twice", b"payload")
        (held,) = c.dequeue_many("twice", 1)
        first = c.store_results("twice", [held], [encode_result("first", 1, 0.1)])
        second = c.store_results("twice", [held], [encode_result("second", 2, 0.1)])
        assert first != second
        seen = c.jobs([job])[0]
        assert seen.runs == 2 and decode_result(seen.result).value == "second"
        assert c.stats("twice.results")["delayed"] == 1  # the first result went


def test_bad_job_requests_get_clear_errors_and_change_nothing(cluster):
    with Client(cluster.master_addr) as c:
        job = c.enqueue("plain", b"x")
        with pytest.raises(TooManyItems):
            c.master.call(p.Jobs(list(range(10_001))))
        with pytest.raises(InvalidArgument, match="wait_s"):
            c.master.call(p.Jobs([job], 61.0))
        with pytest.raises(InvalidArgument, match="holds task results"):
            c.enqueue("plain.results", b"not a result")
        with pytest.raises(InvalidArgument, match="read, not leased"):
            c.dequeue_many("plain.results", 1)
        (held,) = c.dequeue_many("plain", 1)
        with pytest.raises(InvalidArgument, match="time to live"):
            c.store_results("plain", [held], [b"r"], ttl_s=0)
        held.nack(delay_s=0)
        with pytest.raises(LeaseExpired, match="not leased under the tokens"):
            c.store_results("plain", [held], [b"r"])  # no longer its lease holder
        assert c.jobs([job, 999])[0].state == "queued"
        assert c.jobs([999])[0].state == "unknown"
        assert c.stats("plain")["ready"] == 1


def test_a_chain_of_three_with_a_failure_in_the_middle_cancels_the_last(cluster, worker,
                                                                         jobs_dir):
    out = jobs_dir / "out"
    with Client(cluster.master_addr) as c:
        first = step.with_options(client=c, delay_s=1.0).enqueue("a")
        second = step.with_options(client=c, depends_on=[first]).enqueue("b", fail=True)
        third = step.with_options(client=c, depends_on=[second]).enqueue("c")
        assert (second.status(), third.status()) == ("waiting", "waiting")
        assert first.result(timeout_s=30) == "a"
        with pytest.raises(JobFailed, match="step b failed"):
            second.result(timeout_s=30)
        with pytest.raises(JobCancelled):
            third.result(timeout_s=30)
        assert not (out / "ran-c").exists()
        with pytest.raises(InvalidArgument, match="is dead"):
            step.with_options(client=c, depends_on=[second]).enqueue("d")
        with pytest.raises(InvalidArgument, match="no job 123456789"):
            step.with_options(client=c, depends_on=[123456789]).enqueue("e")


def test_a_groups_callback_runs_once_every_job_is_done(cluster, worker, jobs_dir):
    out = jobs_dir / "out"
    with Client(cluster.master_addr) as c:
        jobs = [step.with_options(client=c, delay_s=0.5 * k).enqueue(f"g{k}") for k in range(3)]
        callback = group(jobs).then(report, "all three", client=c)
        label, ran_at = callback.result(timeout_s=30)
        assert label == "all three"
        assert all(float((out / f"ran-g{k}").read_text()) <= ran_at for k in range(3))
        assert group(jobs).results() == ["g0", "g1", "g2"]


def test_dependencies_cancels_and_results_hold_across_a_standby_takeover(cluster_factory):
    """The job book is the WAL's: after the primary is killed and its standby takes over, a job
    still waits for its dependency (and runs after it), a cancelled job stays cancelled, and a
    stored result is still read."""
    cluster = cluster_factory(standby=True, heartbeat_s=0.2, dead_after_s=1.5, datanodes=2)
    wait_for(lambda: "replies now wait for it" in cluster.master.head(), 30, "the standby")
    with Client(cluster.masters, timeout_s=30) as c:
        first = c.enqueue("flow", b"a", delay_s=2.0)
        second = c.enqueue("flow", b"b", depends_on=[first])
        doomed = c.enqueue("flow", b"c", delay_s=600)
        assert c.cancel([doomed]) == [doomed]
        c.enqueue("done", b"d")
        (held,) = c.dequeue_many("done", 1)
        c.store_results("done", [held], [encode_result("kept", 1, 0.1)])
        held.ack(wait=True)
        cluster.master.kill()
        wait_for(lambda: "promoted" in cluster.second.head(), 30, "the standby's promotion")
        seen = {s.id: s for s in c.jobs([first, second, doomed, held.id])}
        assert (seen[second].state, seen[doomed].state) == ("waiting", "cancelled")
        assert decode_result(seen[held.id].result).value == "kept"
        got = wait_for(lambda: c.dequeue_many("flow", 1, wait_s=1.0), 30, "the first job")
        assert [m.id for m in got] == [first]
        got[0].ack(wait=True)
        then = wait_for(lambda: c.dequeue_many("flow", 1, wait_s=1.0), 30, "the second job")
        assert [m.id for m in then] == [second]
