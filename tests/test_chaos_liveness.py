"""Chaos liveness: stalls measured from the workers' calls and charged to faults (synthetic
histories), the report's figures and ``--max-stall-s`` verdict -- and two short real runs made
to stall, one failing a tiny limit and one passing a generous one."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from chaos import report
from chaos.checker import check
from chaos.cli import EXIT_USAGE, cli
from chaos.liveness import (
    ASK,
    DEQUEUE,
    ENQUEUE,
    GOT,
    MISS,
    Call,
    Liveness,
    Stall,
    charge,
    measure,
    stalls,
)

OPTIONS = dict(seed=1, duration_s=60.0, datanodes=5, replication=3, heartbeat_s=0.2,
               dead_after_s=1.5, lease_s=2.0)


def steady(process: str, start: float, end: float, every: float = 0.1,
           took: float = 0.02) -> list[Call]:
    """A worker acknowledged every ``every`` seconds from ``start`` to ``end``."""
    calls, t = [], start
    while t < end - 1e-9:
        calls += [Call(round(t, 4), process, ASK), Call(round(t + took, 4), process, GOT)]
        t += every
    return calls


def fault(kind: str, start: float, end: float, target: int | None = 2) -> dict:
    return {"kind": kind, "target": target, "start": start, "end": end}


def spans(found: list[Stall]) -> list[tuple[float, float]]:
    return [(round(s.began_s, 3), round(s.ended_s, 3)) for s in found]


# -- stalls ----------------------------------------------------------------------------------


def test_a_call_left_unanswered_is_a_stall_from_when_it_was_made():
    calls = [*steady("producer-0", 0, 5), Call(5.0, "producer-0", ASK),
             Call(8.0, "producer-0", GOT), *steady("producer-0", 8.1, 10)]
    assert longest_span(stalls(calls, op=ENQUEUE, until=10)) == (5.0, 8.0)


def test_failed_answers_and_retries_are_one_stall_until_an_acknowledgement():
    calls = steady("producer-0", 0, 2)
    for t in (2.0, 2.5, 3.0, 3.5):  # each fails fast, the producer retries
        calls += [Call(t, "producer-0", ASK), Call(t + 0.05, "producer-0", MISS)]
    calls += [Call(4.0, "producer-0", ASK), Call(4.2, "producer-0", GOT)]
    assert longest_span(stalls(calls, op=ENQUEUE, until=5)) == (2.0, 4.2)


def test_anyone_acknowledged_ends_a_stall_even_if_another_still_waits():
    calls = sorted([Call(1.0, "producer-0", ASK), Call(6.0, "producer-0", GOT),
                    *steady("producer-1", 0, 10, every=0.5)])
    assert max(s.seconds for s in stalls(calls, op=ENQUEUE, until=10)) == pytest.approx(0.5)


def test_a_worker_idle_by_choice_is_not_a_stall():
    """Pacing, or waiting for the backlog to shrink: no call in flight, nothing owed."""
    calls = [Call(0.0, "producer-0", ASK), Call(0.02, "producer-0", GOT),
             Call(7.0, "producer-0", ASK), Call(7.02, "producer-0", GOT)]
    assert spans(stalls(calls, op=ENQUEUE, until=8)) == [(0.0, 0.02), (7.0, 7.02)]


def test_a_worker_that_missed_asks_no_more_once_someone_was_acknowledged():
    """consumer-0's empty answer, then consumer-1 takes items and the standing backlog sends
    consumer-0 to sleep: its old miss is not a stall that lasts until it calls again."""
    calls = [Call(0.0, "consumer-0", ASK), Call(0.5, "consumer-0", MISS),
             Call(0.6, "consumer-1", ASK), Call(0.7, "consumer-1", GOT),
             Call(5.0, "consumer-0", ASK), Call(5.1, "consumer-0", GOT)]
    found = stalls(calls, op=DEQUEUE, until=6, supply=[(0.0, 3000)])
    assert spans(found) == [(0.0, 0.7), (5.0, 5.1)]


def test_an_empty_run_has_no_stalls():
    live = measure({}, [], [])
    assert live.longest == {ENQUEUE: None, DEQUEUE: None} and live.faults == []
    assert live.over(0.0) == [] and live.worst_data_node_fault() is None


def test_an_empty_queue_is_not_a_dequeue_stall():
    """Consumers polling an empty queue get empty answers: right, not a stall. Once an
    acknowledged item waits, their empty answers are one."""
    calls = []
    for t in range(10):  # long polls that come back empty
        calls += [Call(t, "consumer-0", ASK), Call(t + 0.5, "consumer-0", MISS)]
    calls += [Call(10.0, "consumer-0", ASK), Call(10.1, "consumer-0", GOT)]
    unseen = [(0.0, 0), (7.0, 1), (10.1, 0)]  # an item acknowledged at 7 s, taken at 10.1 s
    assert spans(stalls(calls, op=DEQUEUE, until=11, supply=unseen)) == [(7.0, 10.1)]
    assert stalls(calls, op=DEQUEUE, until=11, supply=[(0.0, 0)]) == []


def test_a_stall_still_open_when_the_workload_stops_ends_there():
    calls = [*steady("producer-0", 0, 1), Call(1.0, "producer-0", ASK),
             Call(2.0, "producer-0", MISS)]
    assert longest_span(stalls(calls, op=ENQUEUE, until=2.0)) == (1.0, 2.0)


def longest_span(found: list[Stall]) -> tuple[float, float]:
    return spans([max(found, key=lambda s: s.seconds)])[0]


# -- charging faults -------------------------------------------------------------------------


def test_a_stall_inside_a_fault_window_is_its_figure():
    found = {ENQUEUE: [Stall(ENQUEUE, 0.0, 0.1), Stall(ENQUEUE, 11.0, 14.5)],
             DEQUEUE: [Stall(DEQUEUE, 12.0, 13.0)]}
    (f,) = charge([fault("pause_node", 10.0, 15.0)], found)
    assert (f.enqueue.seconds, f.dequeue.seconds) == pytest.approx((3.5, 1.0))
    assert f.worst == Stall(ENQUEUE, 11.0, 14.5)
    assert f.to_json()["worst"] == {"op": "enqueue", "stall_s": 3.5, "began_s": 11.0,
                                    "ended_s": 14.5}


def test_a_stall_that_began_before_the_fault_counts_from_its_start():
    (f,) = charge([fault("kill_node", 10.0, 12.0)], {ENQUEUE: [Stall(ENQUEUE, 6.0, 11.5)]})
    assert (f.enqueue.began_s, f.enqueue.seconds) == pytest.approx((10.0, 1.5))
    (f,) = charge([fault("kill_node", 10.0, 12.0)], {ENQUEUE: [Stall(ENQUEUE, 6.0, 9.9)]})
    assert f.enqueue is None and f.seconds == 0.0


def test_a_stall_can_outlast_the_heal_but_not_into_the_next_fault():
    later = Stall(ENQUEUE, 12.5, 17.0)  # began in the tail, after the heal at 12 s
    (f,) = charge([fault("kill_node", 10.0, 12.0)], {ENQUEUE: [later]})
    assert f.enqueue == later  # its whole length: nothing else happened
    f, g = charge([fault("kill_node", 10.0, 12.0), fault("pause_node", 14.0, 16.0, 3)],
                  {ENQUEUE: [later]})
    assert (f.enqueue.ended_s, g.enqueue.began_s) == (14.0, 14.0)
    (f,) = charge([fault("kill_node", 10.0, 12.0)], {ENQUEUE: [Stall(ENQUEUE, 13.5, 17.0)]})
    assert f.enqueue is None  # began after the tail: not this fault's


def test_a_stall_a_master_fault_took_part_in_is_the_masters():
    """Churn during a master kill: the outage from the kill on is the master's, only the
    part before it is the data node's."""
    found = {ENQUEUE: [Stall(ENQUEUE, 20.5, 24.0)]}
    churn, master = charge([fault("churn", 20.0, 22.5), fault("kill_master", 21.0, 22.0, None)],
                           found)
    assert master.enqueue == Stall(ENQUEUE, 21.0, 24.0)
    assert churn.enqueue == Stall(ENQUEUE, 20.5, 21.0) and churn.overlaps_master


def test_master_and_client_faults_do_not_count_for_max_stall_s():
    faults = [fault("kill_master", 5.0, 6.0, None), fault("pause_master", 10.0, 13.0, None),
              fault("stall_consumer", 20.0, 23.0, 0), fault("cut_client", 30.0, 33.0, 1),
              fault("pause_node", 40.0, 43.0)]
    found = {ENQUEUE: [Stall(ENQUEUE, 5.0, 8.0), Stall(ENQUEUE, 10.0, 14.0)],
             DEQUEUE: [Stall(DEQUEUE, 20.5, 23.0), Stall(DEQUEUE, 30.0, 33.0),
                       Stall(DEQUEUE, 41.0, 41.4)]}
    live = Liveness({}, charge(faults, found))
    assert [f.kind for f in live.faults if f.seconds > 1] == \
        ["kill_master", "pause_master", "stall_consumer", "cut_client"]
    assert live.over(1.0) == []
    assert [f.kind for f in live.over(0.3)] == ["pause_node"]
    assert live.over(None) == []


# -- the report ------------------------------------------------------------------------------


def history_with_a_paused_node() -> list[dict]:
    """A producer and a consumer, steady but for an enqueue that hangs 3 s during a pause."""
    ops: list[dict] = []

    def op(t: float, process: str, type_: str, f: str, value: object = None) -> None:
        ops.append({"index": len(ops), "time": round(t, 4), "process": process,
                    "type": type_, "f": f, "value": value})

    for seq in range(100):
        t = seq / 10 + (3.0 if seq > 40 else 0.0)
        hang = 3.0 if seq == 40 else 0.0
        op(t, "producer-0", "invoke", "enqueue", {"seqs": [seq], "digests": ["d"]})
        op(t + 0.01 + hang, "producer-0", "ok", "enqueue", {"seqs": [seq], "ids": [seq]})
        op(t + 0.02 + hang, "consumer-0", "invoke", "dequeue", {"n": 1})
        op(t + 0.03 + hang, "consumer-0", "ok", "dequeue",
           {"items": [[seq, seq, "d", True, 1]], "dead_letter": False})
        op(t + 0.04 + hang, "consumer-0", "invoke", "ack", {"ids": [seq]})
        op(t + 0.05 + hang, "consumer-0", "ok", "ack", {"ids": [seq]})
    op(3.9, "nemesis", "ok", "pause_node", {"fault": 0, "target": 2, "duration_s": 3.0})
    op(6.9, "nemesis", "ok", "heal", {"fault": 0, "kind": "pause_node"})
    op(13.0, "drain", "ok", "drain", {"ready": 0, "delayed": 0, "leased": 0})
    return sorted(ops, key=lambda o: o["time"])


@pytest.mark.parametrize("max_stall_s", [None, 5.0, 1.0])
def test_the_report_gives_each_faults_stalls_and_the_verdict(tmp_path, max_stall_s):
    ops = history_with_a_paused_node()
    tl = report.timeline(ops)
    result = check(ops)
    assert result.valid, result.problems
    figures = report.figures(result, {"run_dir": str(tmp_path), "runtime_s": 1.0,
                                      "options": OPTIONS}, tl, max_stall_s=max_stall_s)
    (f,) = figures["liveness"]["faults"]
    assert f["kind"] == "pause_node" and f["data_node"]
    assert f["max_no_enqueue_s"] == pytest.approx(3.01, abs=0.02)
    assert f["max_no_dequeue_s"] < 0.05  # nothing acknowledged was waiting meanwhile
    assert f["worst"]["op"] == "enqueue" and f["worst"]["began_s"] == pytest.approx(4.0, abs=0.1)
    assert figures["liveness"]["longest"]["enqueue"]["stall_s"] == f["max_no_enqueue_s"]
    failed = max_stall_s == 1.0
    assert figures["valid"] is not failed and figures["checker"]["valid"]
    assert [s["kind"] for s in figures["liveness_failed"]] == (["pause_node"] if failed else [])
    text = report.write(str(tmp_path), figures)
    assert "pause_node 3.0/0.0s" in text and "worst data-node fault: pause_node datanode2" in text
    assert ("LIVENESS: 1 data-node fault stalled the clients longer than --max-stall-s 1"
            in text) is failed
    assert text.startswith(f"Blizzard chaos run: {'FAIL' if failed else 'PASS'}")
    assert len(text.splitlines()) < 30
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["max_stall_s"] == max_stall_s and saved["liveness"] == figures["liveness"]
    report.plot(tl, [{"time": 0.0, "under_replicated": 0}], str(tmp_path / "timeline.png"),
                "test", max_stall_s=max_stall_s)
    assert (tmp_path / "timeline.png").stat().st_size > 1000


def test_the_cli_refuses_more_replicas_than_data_nodes():
    result = CliRunner().invoke(cli, ["run", "--seed", "1", "--datanodes", "4",
                                      "--replication", "5"])
    assert result.exit_code == EXIT_USAGE and "--replication is larger" in result.output
    result = CliRunner().invoke(cli, ["run", "--seed", "1", "--max-stall-s", "-1"])
    assert result.exit_code == EXIT_USAGE


# -- real runs -------------------------------------------------------------------------------

# One pause of a data node (seed 5: at 3.56 s for 3.25 s) in a cluster of four with R=W=4:
# every enqueue needs the paused node, so the run is made to stall whatever the client does.
STALLED_RUN = ["--seed", "5", "--duration-s", "11", "--datanodes", "4", "--replication", "4",
               "--node-kills", "0", "--node-wipes", "0", "--master-kills", "0",
               "--node-pauses", "1", "--master-pauses", "0", "--consumer-stalls", "0",
               "--rate", "100", "--batch-min", "5", "--batch-max", "10",
               "--standing-backlog", "0", "--log-level", "warning"]


@pytest.mark.cluster
def test_chaos_max_stall_s_fails_a_run_made_to_stall(tmp_path):
    """The same stalled run twice at once: over a tiny limit it fails, saying why; under a
    generous one it passes, with the same stall measured."""
    limits = {"tiny": "0.2", "generous": "60"}
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "chaos", "run", *STALLED_RUN, "--max-stall-s", limit,
         "--run-dir", str(tmp_path / name)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for name, limit in limits.items()}
    out = {}
    for name, proc in procs.items():
        try:
            out[name] = (*proc.communicate(timeout=120), proc.returncode)
        finally:
            proc.kill()
    for name, (stdout, stderr, rc) in out.items():
        print(f"===== {name}: exit {rc}\n{stdout}\n{stderr[-3000:]}")
    tiny, generous = (json.loads((tmp_path / name / "report.json").read_text())
                      for name in limits)

    assert out["tiny"][2] == 1
    assert tiny["checker"]["valid"] and not tiny["valid"]  # safe, but not live
    (stalled,) = tiny["liveness_failed"]
    assert stalled["kind"] == "pause_node" and stalled["worst"]["op"] == "enqueue"
    assert stalled["max_no_enqueue_s"] > 1.0
    assert "LIVENESS: 1 data-node fault stalled the clients longer than --max-stall-s 0.2: " \
           "pause_node" in out["tiny"][0]

    assert out["generous"][2] == 0
    assert generous["valid"] and generous["liveness_failed"] == []
    (paused,) = generous["liveness"]["faults"]
    assert paused["kind"] == "pause_node" and paused["max_no_enqueue_s"] > 1.0
    assert "LIVENESS" not in out["generous"][0]
