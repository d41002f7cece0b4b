"""The gateways as a user migrating from SQS or beanstalkd uses them (what a new user's
review tried): the query API's queue in the request path, receives with a visibility of 0,
a late delete with the latest handle, list-tubes, a job whose ttr ran out, releases without
limit, a tube's lease changed while workers are connected, stats-job's fields."""

from __future__ import annotations

import greenstalk
import pytest
from botocore.exceptions import ClientError

from blizzard import Client

from support.gateway import beanstalkd_on_new_cluster
from support.sqs import boto, gateway_on_new_cluster, signed
from support.wait import wait_for

pytestmark = pytest.mark.cluster


# -- fixtures, as in test_sqs_gateway.py and test_beanstalkd_gateway.py -----------------------

@pytest.fixture
def sqs_gateway(cluster_factory, tmp_path):
    yield from gateway_on_new_cluster(cluster_factory, tmp_path)


@pytest.fixture
def beans(cluster_factory, monkeypatch):
    yield from beanstalkd_on_new_cluster(cluster_factory, monkeypatch)


def connect(gw, **kw) -> greenstalk.Client:
    return greenstalk.Client(("127.0.0.1", gw.port), encoding=None, **kw)


# -- SQS --------------------------------------------------------------------------------------

def test_query_protocol_takes_the_queue_url_as_the_request_path(sqs_gateway):
    """SQS's query API names the queue by the URL the request is sent to (AWS's own examples,
    boto 2, kombu's query-protocol connection: ``POST /ACCOUNT/QUEUE`` with
    ``Action=SendMessage`` and no ``QueueUrl`` parameter). The gateway answers
    ``MissingParameter: The request must contain the parameter QueueUrl``."""
    sqs = boto(sqs_gateway.url)
    url = sqs.create_queue(QueueName="bypath")["QueueUrl"]
    status, body = signed(sqs_gateway, {"Action": "SendMessage", "MessageBody": "by path",
                                        "Version": "2012-11-05"}, path="/000000000000/bypath")
    assert status == 200, body
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert got[0]["Body"] == "by path"


def test_receive_with_visibility_timeout_zero_never_fails(sqs_gateway):
    """ReceiveMessage(VisibilityTimeout=0) is legal SQS (docs/sqs.md: "0 is a lease of 1 ms"),
    but about one receive in five fails with AccessDenied "the cluster refused: data nodes
    refused to serve items [...]: the grant expired 0.0s ago (start the gateway with --admin
    ...)": the master's read grant ends with the lease (master/consume/leases.py, get_grant(...,
    until)), 1 ms later, before the gateway has read the body from the data nodes."""
    sqs = boto(sqs_gateway.url)
    url = sqs.create_queue(QueueName="peek")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="look, don't take")
    failures = []
    for _ in range(20):
        try:
            got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2,
                                      VisibilityTimeout=0).get("Messages", [])
            assert [m["Body"] for m in got] == ["look, don't take"]
        except ClientError as exc:
            failures.append(exc.response["Error"])
    assert failures == []


def test_queue_visibility_timeout_zero_never_fails(sqs_gateway):
    """The same with the queue's VisibilityTimeout attribute set to 0."""
    sqs = boto(sqs_gateway.url)
    url = sqs.create_queue(QueueName="peek0", Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="again and again")
    failures = []
    for _ in range(20):
        try:
            assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2).get("Messages")
        except ClientError as exc:
            failures.append(exc.response["Error"])
    assert failures == []


# -- beanstalkd -------------------------------------------------------------------------------

def test_list_tubes_answers_once_a_tube_exists(beans):
    """``list-tubes`` (docs/beanstalkd.md: "as in beanstalkd") answers INTERNAL_ERROR as soon
    as any queue exists: cmd_list_tubes reads q["name"], but Client.queues() gives "queue"
    (the log: "list-tubes failed: KeyError: 'name'")."""
    with connect(beans, use="emails") as c:
        c.put(b"hello")
        assert set(c.tubes()) >= {"default", "emails"}


def test_a_job_whose_ttr_ran_out_does_not_make_every_later_reserve_deadline_soon(beans):
    """A worker that overran a job's time to run: beanstalkd gives the job back and the
    connection reserves as before. Here the connection keeps the job's deadline (in
    ``deadlines``) after its lease ended, so every reserve from then on answers DEADLINE_SOON
    at once, with jobs ready, for ever (greenstalk: DeadlineSoonError in a busy loop)."""
    with Client(beans.cluster.master_addr, timeout_s=10) as native:
        native.create_queue("slow", lease_s=1.0)
    with connect(beans, use="slow", watch="slow") as c:
        c.put(b"a", ttr=1)
        c.reserve(timeout=10)
        with Client(beans.cluster.master_addr, timeout_s=10) as native:  # its ttr ran out
            wait_for(lambda: native.stats("slow")["ready"] == 1, timeout_s=15)
        c.put(b"b")

        def reserved() -> greenstalk.Job | None:
            try:
                return c.reserve(timeout=5)
            except greenstalk.DeadlineSoonError:  # fair while the gateway's own clock says the
                return None  # job's last second has not passed yet (it was slow to see it)
        job = wait_for(reserved, timeout_s=5, what="a reserve that is not DEADLINE_SOON")
        assert job.body in (b"a", b"b")


def test_releasing_a_job_many_times_never_buries_it(beans):
    """beanstalkd has no attempt limit: a job may be released any number of times. A tube made
    by the gateway gets the cluster's default max_attempts (10), so the 10th release silently
    buries the job (moves it to TUBE.dead); docs/beanstalkd.md does not say so. (Queues made by
    the SQS gateway get max_attempts 0, unlimited, as SQS without a RedrivePolicy.)"""
    with connect(beans, use="again", watch="again") as c:
        c.put(b"retry me")
        for attempt in range(12):
            job = c.reserve(timeout=5)  # TimedOutError at attempt 10
            assert job.body == b"retry me", attempt
            c.release(job)
        assert c.stats_tube("again")["current-jobs-buried"] == 0


def test_a_tubes_new_lease_applies_to_connections_already_open(beans):
    """A job without a ttr of its own (one a Blizzard client enqueued) is leased for its
    tube's lease_s; a worker connected before the tube's lease changed sees the new one
    within the gateway's 2 s (it read the lease once for the connection's life before)."""
    with Client(beans.cluster.master_addr, timeout_s=10) as native:
        native.create_queue("ttr", lease_s=30.0, max_attempts=0)
        with connect(beans, watch="ttr") as worker:
            native.enqueue("ttr", b"first")
            job = worker.reserve(timeout=10)
            assert worker.stats_job(job)["ttr"] == 30
            worker.delete(job)
            native.configure_queue("ttr", lease_s=1.0)
            native.enqueue("ttr", b"second")

            def new_lease_seen() -> bool:
                job = worker.reserve(timeout=10)
                seen = worker.stats_job(job)["ttr"]
                worker.release(job)
                return seen == 1

            wait_for(new_lease_seen, timeout_s=10, what="the tube's new lease")


def test_stats_job_counts_this_reservation_and_shows_the_jobs_priority(beans):
    """beanstalkd's stats-job: ``reserves`` counts every reservation, the current one included
    (Laravel's BeanstalkdJob::attempts() is this number), ``pri`` is the job's priority
    whoever asks, and age, delay, ttr, time-left, timeouts and file are always there. Here a
    reserved job says ``reserves: 0`` (cmd_stats_job: the item's attempts, failures so far),
    ``pri`` is 0 unless the asking connection holds the job, and those fields are missing."""
    with connect(beans, use="sj", watch="sj") as worker, connect(beans) as watcher:
        job_id = worker.put(b"x", priority=100)
        assert watcher.stats_job(job_id)["pri"] == 100  # 0 here
        worker.reserve(timeout=10)
        stats = watcher.stats_job(job_id)
        assert stats["state"] == "reserved"
        assert stats["reserves"] == 1  # 0 here
        assert {"age", "delay", "ttr", "time-left", "timeouts"} <= set(stats)


def test_delete_after_the_visibility_timeout_with_the_latest_handle_deletes(sqs_gateway):
    """SQS deletes a message given its most recent receipt handle, even once the visibility
    timeout has run out, as long as nobody received it again; docs/sqs.md says the same ("a
    handle of an earlier delivery carries that delivery's lease token, which the master
    refuses once the item is leased again"). Here the master refuses the token as soon as
    the lease ends: DeleteMessage answers 200, deletes nothing, and the message the worker
    finished is delivered again (a slow worker's every job runs twice)."""
    sqs = boto(sqs_gateway.url)
    url = sqs.create_queue(QueueName="late", Attributes={"VisibilityTimeout": "1"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="slow job")
    m = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]
    with Client(sqs_gateway.cluster.master_addr, timeout_s=10) as native:  # past its timeout
        wait_for(lambda: native.stats("late")["ready"] == 1, timeout_s=15)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])  # no one took it since
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)
