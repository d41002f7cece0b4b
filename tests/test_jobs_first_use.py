"""A new user's first session with the job features, as the docs show them: a task with safe
points called directly, ``blizzard cancel`` and ``blizzard job`` on a schedule's job, a call
whose arguments do not fit, a dead job's error shown once."""

from __future__ import annotations

import pytest

import blizzard
from blizzard import Client, InvalidArgument, JobFailed, JobHandle
from blizzard.worker.task import encode_call, task

from support.cli import output
from support.wait import wait_for
from support.worker_proc import running_worker

JOBS = '''
import blizzard
from blizzard.worker.task import task

@task(queue="math", max_attempts=1)
def add(x, y):
    return x + y

@task(queue="math", max_attempts=1)
def explode():
    raise ValueError("cannot do it")

@task(queue="ticks", every_s=1.0)
def heartbeat():
    return blizzard.current_tick()
'''


@task(queue="math", max_attempts=1)
def add(x: int, y: int) -> int: ...


@task(queue="math", max_attempts=1)
def explode() -> None: ...


@pytest.fixture
def worker(cluster, tmp_path):
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "out").mkdir()
    with running_worker(tmp_path, cluster.master_addr) as proc:
        yield proc


# -- in process ------------------------------------------------------------------------------

@task(queue="batch")
def crunch(paths: list) -> int:
    done = 0
    for _ in paths:
        blizzard.cancelled()                        # the safe point, as cancellation.md shows
        blizzard.progress(done / len(paths), note="going", state={"done": done})
        done += 1
    return done


def test_a_plain_call_runs_a_task_that_has_safe_points():
    # guide.md: `make_thumbnail("f.png", 4)  # a plain call runs it here and now`; and
    # cancellation.md / progress.md put blizzard.cancelled() / progress() in the task body.
    # Together: a task written as the docs show cannot be called plainly (e.g. in a unit
    # test); it raises RuntimeError("no job runs in this thread ...").
    assert crunch(["a", "b"]) == 2


# -- against a cluster and a worker -----------------------------------------------------------

def test_blizzard_cancel_of_a_schedules_job_does_not_say_it_ended(cluster, worker):
    # cancellation.md: a schedule's job is not cancelled ("remove the schedule"). `blizzard
    # cancel` says instead "not cancelled: it had ended, or is unknown", neither of which
    # is true for a live schedule's job.
    with Client(cluster.master_addr) as c:
        wait_for(lambda: c.schedules(["heartbeat"]), 20, "the worker to declare its schedule")
        (s,) = c.schedules(["heartbeat"])
    text = output(cluster.master_addr, "cancel", str(s.job))
    assert f"job {s.job}: not cancelled" in text
    assert "had ended" not in text and "schedule" in text, text


def test_blizzard_job_does_not_call_a_schedules_ticks_repeated_deliveries(cluster, worker):
    # results.md: "ran 2 times" is for a job run twice (at least once delivery). A schedule's
    # job runs once per tick, yet `blizzard job` shows "ran 3 times (delivery is at least
    # once)", as if each tick had been delivered again.
    with Client(cluster.master_addr) as c:
        wait_for(lambda: c.schedules(["heartbeat"]) and c.schedules(["heartbeat"])[0].runs >= 3,
                 30, "three ticks to run")
        (s,) = c.schedules(["heartbeat"])
    text = output(cluster.master_addr, "job", str(s.job))
    assert "delivery is at least once" not in text, text


def test_a_call_with_wrong_arguments_is_refused_at_enqueue_and_buried_at_once_on_a_worker(
        cluster, worker):
    """A call that does not fit the task's signature is refused at ``enqueue``, naming the
    task; one that got in anyway (made by hand) is buried at once on the worker, not retried,
    with an error that names the task, not the worker's own files."""
    with Client(cluster.master_addr) as c:
        with pytest.raises(InvalidArgument, match=r"task add\(x.*missing a required argument: "
                                                  "'y'"):
            add.with_options(client=c).enqueue(1)          # y is missing
        job = JobHandle(c.enqueue("math", encode_call("add", [1], {})), "math", lambda: c)
        with pytest.raises(JobFailed) as failed:
            job.result(timeout_s=30)
        assert job.info().attempts <= 1  # no retry could help
    assert "task add(x, y): missing a required argument: 'y'" in failed.value.error
    assert "blizzard/worker/runner.py" not in failed.value.error, failed.value.error


def test_blizzard_job_shows_a_dead_jobs_error_once(cluster, worker):
    # `blizzard job ID` of a dead job prints its error twice: "last error: ..." and then
    # "error: '...'" (the same text, repr-quoted).
    with Client(cluster.master_addr) as c:
        job = explode.with_options(client=c).enqueue()
        with pytest.raises(JobFailed):
            job.result(timeout_s=30)
    text = output(cluster.master_addr, "job", str(job.id))
    assert text.count("cannot do it") == 1, text
