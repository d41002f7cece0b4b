"""The status page: its history and JSON (unit) and its HTTP side, served in process.
The real command and the page in a real browser are in ``test_dashboard_page.py``."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import blizzard.dashboard.sampler
from blizzard import Client, InvalidArgument
from blizzard.dashboard.sampler import (
    MAX_POINTS,
    MAX_QUEUES_SHOWN,
    MAX_SAMPLES,
    History,
    JobsView,
    Sampler,
    StateCache,
    increase,
    state_doc,
    take_sample,
)
from blizzard.dashboard.server import make_server
from blizzard.local.harness import free_port
from blizzard.net.http_guard import host_and_port
from blizzard.wire import protocol as p
from blizzard.wire.queue_settings import SETTINGS

from support.http_get import closed, get
from support.wait import wait_for

MASTER = "tcp://127.0.0.1:5555"


def queue(name: str, ready: int = 0, enqueued: int = 0, acked: int = 0, dead: int = 0,
          **settings: object) -> p.QueueStats:
    chosen = p.QueueSettings(**{s.name: settings.get(s.name, s.default) for s in SETTINGS})
    return p.QueueStats(name, ready, 0, 0, 0, dead, 0.0, enqueued, acked, chosen)


def status(*queues: p.QueueStats, dead_nodes: int = 0) -> p.ClusterStatus:
    nodes = [p.NodeStatus(f"n{i}", f"tcp://127.0.0.1:{7000 + i}", i >= dead_nodes, 0.2, 5, 100,
                          10**9) for i in range(3)]
    return p.ClusterStatus(nodes, list(queues), 0, 2, True, False)


# -- the history and its document -----------------------------------------------------------

def test_a_total_that_shrank_restarted_from_zero():
    assert increase(10, 15) == 5
    assert increase(10, 3) == 3  # the master restarted and has counted 3 since


def test_rates_come_from_totals_between_answered_samples_even_across_a_failure():
    h = History(interval_s=2.0, history_s=600.0)
    h.add(1000.0, 0.0, status(queue("jobs", enqueued=0)))
    h.add(1002.0, 2.0, None, "master did not answer (MasterUnavailable)")
    h.add(1004.0, 4.0, status(queue("jobs", ready=40, enqueued=40, acked=8)))
    doc = state_doc(h, MASTER, now=1004.5)
    (jobs,) = doc["queues"]
    assert (jobs["enqueue_per_s"], jobs["ack_per_s"]) == (10.0, 2.0)  # 40 and 8 over 4 s
    series = doc["history"]["queues"]["jobs"]
    assert series["ready"] == [0, None, 40]  # the failed sample is a gap in the chart
    assert series["enqueue_per_s"] == [None, None, 10.0]
    assert doc["history"]["t"] == [1000.0, 1002.0, 1004.0]


def test_the_history_is_bounded():
    h = History(interval_s=1.0, history_s=10.0)
    for i in range(100):
        h.add(float(i), float(i), status(queue("jobs", ready=i)))
    samples = h.samples()
    assert len(samples) == 10 and samples[0].at == 90.0


def test_a_history_longer_than_its_sample_bound_is_refused_with_what_would_fit():
    with pytest.raises(InvalidArgument, match="432000 samples, more than 3600: sample every "
                       "24 s or more, or keep at most 720 s"):
        History(interval_s=0.2, history_s=86_400)
    assert History(interval_s=24, history_s=86_400).interval_s == 24


def test_a_full_history_is_drawn_in_a_bounded_number_of_points():
    # Given the longest history allowed, a queue growing 10 items a second
    h = History(interval_s=1.0, history_s=MAX_SAMPLES)
    for i in range(MAX_SAMPLES + 10):
        h.add(1000.0 + i, float(i), status(queue("jobs", ready=i, enqueued=10 * i)))
    doc = state_doc(h, MASTER, now=5000.0)
    # Then each chart has at most MAX_POINTS points, the newest last, with the runs' rates
    t, series = doc["history"]["t"], doc["history"]["queues"]["jobs"]
    assert 100 < len(t) <= MAX_POINTS and t[-1] == 1000.0 + MAX_SAMPLES + 9
    assert len(series["ready"]) == len(t) and series["ready"][-1] == MAX_SAMPLES + 9
    assert set(series["enqueue_per_s"]) == {10.0} and set(series["ack_per_s"]) == {0.0}
    assert doc["queues"][0]["enqueue_per_s"] == 10.0


def test_the_state_is_made_once_per_sample_however_many_requests(monkeypatch):
    made = []
    monkeypatch.setattr(blizzard.dashboard.sampler, "state_doc",
                        lambda *args: made.append(args) or {"now": args[2], "queues": []})
    h = History()
    h.add(1000.0, 0.0, status(queue("jobs")))
    cache = StateCache(h, MASTER)
    first, second = json.loads(cache.body(1001.0)), json.loads(cache.body(1002.0))
    assert (first["now"], second["now"], len(made)) == (1001.0, 1002.0, 1)
    h.add(1002.0, 2.0, status(queue("jobs")))
    assert json.loads(cache.body(1003.0)) == {"now": 1003.0, "queues": []} and len(made) == 2


def test_the_dead_letter_hint_names_the_queue_in_force():
    h = History()
    h.add(1000.0, 0.0, status(queue("jobs", dead=2),
                              queue("mail", dead=1, dead_letter="graveyard")))
    doc = state_doc(h, MASTER, now=1000.0)
    assert {q["queue"]: q["dead_letter"] for q in doc["queues"]} == \
        {"jobs": "jobs.dead", "mail": "graveyard"}


def test_an_unreachable_master_is_said_with_the_last_figures_and_their_time():
    h = History()
    h.add(1000.0, 0.0, status(queue("jobs", ready=7), dead_nodes=1))
    h.add(1002.0, 2.0, None, "master did not answer within 3s (MasterUnavailable)")
    doc = state_doc(h, MASTER, now=1003.0)
    assert doc["reachable"] is False and "MasterUnavailable" in doc["error"]
    assert doc["sampled_at"] == 1002.0 and doc["answered_at"] == 1000.0
    assert doc["queues"][0]["ready"] == 7
    assert (doc["cluster"]["nodes_alive"], doc["cluster"]["nodes_dead"]) == (2, 1)


def test_before_any_answer_the_document_has_no_cluster():
    h = History()
    h.add(1000.0, 0.0, None, "no answer")
    doc = state_doc(h, MASTER, now=1000.0)
    assert doc["cluster"] is None and doc["queues"] == [] and doc["answered_at"] is None


def test_schedules_and_jobs_in_progress_are_in_the_document():
    h = History()
    tick = p.ScheduleInfo(p.ScheduleSpec("nightly", "etl", "30 2 * * *", 0.0, "Europe/Berlin",
                                         True), 7, 1_800_000_000.0, 3, 10, 1, "delayed", "")
    leased = p.Leased("", [], [], [], [], [], [], [], [], [], [], [], p.GetGrant([], [], 0, 0.0,
                                                                                  b""), [])
    running = p.JobStates([9], ["running"], ["etl"], [1], [0], [""], [True], [0.25],
                          ["row 250"], leased, [])
    h.add(1000.0, 0.0, status(queue("etl")), jobs=JobsView([tick], running))
    doc = state_doc(h, MASTER, now=1000.0)
    assert doc["schedules"] == [{"name": "nightly", "queue": "etl", "job": 7,
                                 "when": "30 2 * * *", "timezone": "Europe/Berlin",
                                 "next_at": 1_800_000_000.0, "runs": 3, "state": "delayed",
                                 "error": ""}]
    assert doc["progress"] == [{"id": 9, "queue": "etl", "progress": 0.25, "note": "row 250",
                                "attempts": 1, "cancel_requested": True}]
    h.add(1002.0, 2.0, status(queue("etl")))  # an older master tells neither
    assert state_doc(h, MASTER, now=1002.0)["schedules"] == []


def test_queues_past_the_limit_are_counted_not_shown():
    h = History()
    h.add(1000.0, 0.0, status(*[queue(f"q{i:03}") for i in range(MAX_QUEUES_SHOWN + 5)]))
    doc = state_doc(h, MASTER, now=1000.0)
    assert len(doc["queues"]) == MAX_QUEUES_SHOWN and doc["queues_hidden"] == 5
    assert len(doc["history"]["queues"]) == MAX_QUEUES_SHOWN


def test_the_sampler_records_a_master_that_does_not_answer():
    h = History(interval_s=0.2)
    sampler = Sampler(lambda: Client(f"tcp://127.0.0.1:{free_port()}", timeout_s=0.3, keys=""),
                      h).start()
    try:
        wait_for(lambda: h.samples(), what="a sample")
    finally:
        sampler.stop()
    first = h.samples()[0]
    assert first.status is None and "MasterUnavailable" in first.error


def test_a_sample_that_fails_in_any_way_is_a_failed_sample_not_a_dead_sampler():
    def broken() -> p.ClusterStatus:
        raise RuntimeError("a bug")
    assert take_sample(broken) == (None, "a bug (RuntimeError)")


# -- HTTP -----------------------------------------------------------------------------------

@pytest.fixture
def serve() -> Iterator:
    """Start page servers on a history with one queue: ``serve(**make_server options)`` is
    the page's address."""
    servers = []

    def start(**options: object) -> str:
        h = History()
        h.add(1000.0, 0.0, status(queue("jobs", ready=3)))
        server = make_server("127.0.0.1", 0, h, MASTER, **options)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page_server(serve) -> str:
    return serve()


def test_the_api_serves_the_state_as_json(page_server):
    code, headers, body = get(page_server + "/api/state")
    assert code == 200 and headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["master"] == MASTER and doc["queues"][0]["queue"] == "jobs"
    assert doc["queues"][0]["ready"] == 3 and doc["cluster"]["secure"] is True


def test_the_page_loads_nothing_from_elsewhere(page_server):
    code, headers, html = get(page_server + "/")
    assert code == 200 and b'src="/dashboard.js"' in html and b'href="/dashboard.css"' in html
    assert b"//" not in html.replace(b"<!doctype", b"")  # no address of another host
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for asset in ("/dashboard.js", "/dashboard.css"):
        code, _, body = get(page_server + asset)
        assert code == 200 and b"https://" not in body and b"import(" not in body


def test_unknown_paths_and_methods_are_refused_and_the_server_lives_on(page_server):
    assert get(page_server + "/../../etc/passwd")[0] == 404
    assert get(page_server + "/api/state", method="POST")[0] == 501
    assert get(page_server + "/api/state")[0] == 200


def test_a_host_header_is_read_as_a_name_and_a_port():
    assert host_and_port("LocalHost:8080") == ("localhost", 8080)
    assert host_and_port("dash.example.") == ("dash.example", None)
    assert host_and_port("[::1]:80") == ("[::1]", 80) and host_and_port("[::1]") == ("[::1]", None)
    for bad in ("evil@127.0.0.1:80", "a:b", ":80", "a:٣", "a/b"):
        assert host_and_port(bad) is None


def raw_get(url: str, request: bytes) -> bytes:
    """The reply to ``request`` sent as is (urllib always sends a Host header)."""
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as s:
        s.sendall(request)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    return reply


def test_a_request_for_another_host_is_refused(serve):
    # DNS rebinding: a page of evil.example, its name now resolving to 127.0.0.1, asks
    url = serve(allow_hosts=["Dash.Example"])
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example:" + port, "evil.example", "127.0.0.1:1", "localhost:" + port + "0"):
        code, _, body = get(url + "/api/state", headers={"Host": host})
        assert code == 421 and b"--allow-host" in body and b"jobs" not in body, host
    assert raw_get(url, b"GET /api/state HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 421 ")
    for host in ("127.0.0.1:" + port, "localhost:" + port, "LOCALHOST", "dash.example:" + port,
                 "dash.example"):
        code, _, body = get(url + "/api/state", headers={"Host": host})
        assert code == 200 and json.loads(body)["queues"][0]["queue"] == "jobs", host



def test_idle_connections_cannot_pile_up_threads_and_time_out(serve):
    url = serve(idle_timeout_s=2.0, max_connections=4)
    port = int(url.rsplit(":", 1)[1])
    threads_before = threading.active_count()
    # When 12 connections are opened and send nothing
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(12)]
    try:
        opened = time.monotonic()
        # then the 8 above the limit are closed at once, and at most 4 threads serve the rest
        wait_for(lambda: sum(map(closed, idle)) >= 8, timeout_s=10, what="8 closed at once")
        assert time.monotonic() - opened < 2.0 and sum(map(closed, idle)) == 8
        assert threading.active_count() <= threads_before + 4
        # and once the others time out, the page answers again
        wait_for(lambda: all(map(closed, idle)), timeout_s=10, what="idle ones timed out")
        assert get(url + "/api/state")[0] == 200
    finally:
        for sock in idle:
            sock.close()


def test_a_connection_trickling_its_request_is_cut_at_its_deadline(serve):
    url = serve(idle_timeout_s=1.0, connection_s=2.0)
    request = b"GET /api/state HTTP/1.0\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as slow:
        opened = time.monotonic()
        for byte in request:  # one byte each 0.2 s: never idle for the 1 s timeout
            if closed(slow):
                break
            slow.send(bytes([byte]))
            time.sleep(0.2)  # the attacker's pace, not a wait for the server
        assert closed(slow) and 2.0 <= time.monotonic() - opened < 4.0
