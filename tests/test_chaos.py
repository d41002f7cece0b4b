"""Chaos: the checker on hand-written histories, the schedule, payloads, the report -- and one
short real run against a cluster of processes (``BLIZZARD_CHAOS_DURATION_S``, default 60)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import pairwise

import pytest

from chaos import history, payload, report
from chaos.checker import check
from chaos.schedule import (
    CHURN,
    KILL_MASTER,
    PAUSE_MASTER,
    PAUSE_NODE,
    STALL_CONSUMER,
    FaultPlan,
    Timing,
    make_schedule,
)

CHAOS_DURATION_S = float(os.environ.get("BLIZZARD_CHAOS_DURATION_S", "40"))


class Story:
    """Builds a history op by op, the way the workload records one."""

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.t = 0.0

    def op(self, process: str, type_: str, f: str, value: object = None, **extra: object) -> None:
        self.t += 0.01
        self.ops.append({"index": len(self.ops), "time": round(self.t, 3), "process": process,
                         "type": type_, "f": f, "value": value, **extra})

    def enqueue(self, seqs: list[int], ids: list[int] | None, outcome: str = "ok",
                process: str = "producer-0", **extra: object) -> None:
        digests = [payload.digest(payload.make(0, s)) for s in seqs]
        self.op(process, "invoke", "enqueue", {"seqs": seqs, "digests": digests})
        value: dict = {"seqs": seqs}
        if ids is not None:
            value["ids"] = ids
        self.op(process, outcome, "enqueue", value, **extra)

    def dequeue(self, pairs: list[tuple[int, int]], process: str = "consumer-0",
                data: dict[int, bytes] | None = None, dead_letter: bool = False) -> None:
        items = []
        for item_id, seq in pairs:
            got = payload.parse((data or {}).get(seq, payload.make(0, seq)))
            items.append([item_id, got.seq, got.digest, got.intact, 0])
        self.op(process, "invoke", "dequeue", {"n": 50})
        self.op(process, "ok", "dequeue", {"items": items, "dead_letter": dead_letter})

    def ack(self, ids: list[int], outcome: str = "ok", process: str = "consumer-0",
            value: dict | None = None) -> None:
        self.op(process, "invoke", "ack", {"ids": ids})
        self.op(process, outcome, "ack", value if value is not None else {"ids": ids})

    def drain(self, ready: int = 0, leased: int = 0) -> None:
        self.op("drain", "invoke", "drain")
        self.op("drain", "ok", "drain", {"ready": ready, "delayed": 0, "leased": leased,
                                         "pending": 0, "under_replicated": 0})

    def consume(self, pairs: list[tuple[int, int]]) -> None:
        self.dequeue(pairs)
        self.ack([i for i, _ in pairs])


def healthy() -> Story:
    s = Story()
    s.enqueue([0, 1, 2], [100, 101, 102])
    s.enqueue([3, 4], [103, 104], process="producer-1")
    s.consume([(100, 0), (101, 1), (102, 2)])
    s.consume([(103, 3), (104, 4)])
    return s


# -- checker -------------------------------------------------------------------------------


def test_a_clean_history_passes():
    s = healthy()
    s.drain()
    r = check(s.ops)
    assert r.valid, r.problems
    assert (r.attempted, r.acknowledged, r.dequeued, r.delivered) == (5, 5, 5, 5)
    assert (r.lost, r.unexpected, r.duplicated, r.duplicate_rate) == (0, 0, 0, 0.0)
    assert r.acks == {"ok": 2}
    assert r.final_queue == {"ready": 0, "delayed": 0, "leased": 0}


def test_an_acknowledged_enqueue_never_dequeued_is_lost():
    s = healthy()
    s.enqueue([5, 6], [105, 106])
    s.consume([(105, 5)])
    s.drain()
    r = check(s.ops)
    assert not r.valid
    assert r.lost == 1 and r.examples["lost"] == [6]
    assert "lost: 1" in r.problems


def test_a_dequeued_item_never_enqueued_is_unexpected():
    s = healthy()
    s.consume([(999, 77)])
    s.drain()
    r = check(s.ops)
    assert not r.valid
    assert r.unexpected == 1 and r.examples["unexpected"] == [77]


def test_payloads_that_differ_from_what_was_sent_are_mismatches():
    s = Story()
    s.enqueue([0, 1, 2], [10, 11, 12])
    damaged = bytearray(payload.make(0, 1))
    damaged[-1] ^= 0xFF  # the embedded checksum no longer matches
    s.dequeue([(10, 0), (11, 1), (12, 2)],
              data={0: payload.make(1, 0),  # well formed, but another run's bytes
                    1: bytes(damaged),
                    2: b"not a chaos payload"})
    s.ack([10, 11, 12])
    s.drain()
    r = check(s.ops)
    assert not r.valid
    assert r.payload_mismatches == 3 and r.examples["payload_mismatches"] == [10, 11, 12]


def test_one_id_given_to_two_items_is_reuse():
    s = Story()
    s.enqueue([0], [10])
    s.enqueue([1], [10], process="producer-1")
    s.consume([(10, 0)])
    s.consume([(11, 1)])
    s.drain()
    r = check(s.ops)
    assert not r.valid
    assert r.ids_reused == 1 and r.examples["ids_reused"] == [10]


def test_a_dequeue_whose_id_disagrees_with_the_enqueue_is_reuse():
    s = Story()
    s.enqueue([0, 1], [10, 11])
    s.consume([(10, 0), (10, 1)])  # the master handed out id 10 for seq 1 as well
    s.drain()
    assert check(s.ops).ids_reused == 1


def test_duplicates_are_allowed_and_reported_as_a_rate():
    s = healthy()
    s.dequeue([(100, 0), (101, 1)], process="consumer-1")  # redelivered after a lease expired
    s.ack([100, 101], process="consumer-1")
    s.drain()
    r = check(s.ops)
    assert r.valid, r.problems
    assert (r.duplicated, r.redeliveries, r.delivered) == (2, 2, 7)
    assert r.duplicate_rate == pytest.approx(2 / 5)


def test_items_read_from_the_dead_letter_queue_are_not_lost():
    s = healthy()
    s.enqueue([5, 6], [105, 106])
    s.consume([(105, 5)])
    s.dequeue([(106, 6)], process="consumer-dead", dead_letter=True)
    s.ack([106], process="consumer-dead")
    s.drain()
    r = check(s.ops)
    assert r.valid, r.problems
    assert (r.lost, r.dead_lettered) == (0, 1)


def test_indeterminate_enqueues_are_recovered_or_not():
    s = healthy()
    s.enqueue([5, 6], [105, 106], outcome="info")  # the commit may have landed...
    s.enqueue([7], [107], outcome="info", error="MasterUnavailable: no answer within 10s")
    s.op("producer-1", "invoke", "enqueue", {"seqs": [8], "digests": ["x"]})  # never completed
    s.consume([(105, 5), (106, 6)])  # ...and it had, for these two
    s.drain()
    r = check(s.ops)
    assert r.valid, r.problems
    assert (r.indeterminate, r.recovered, r.not_recovered) == (4, 2, 2)
    assert r.errors == {"enqueue info MasterUnavailable": 1}


def test_a_definitely_failed_enqueue_that_appears_is_a_violation():
    s = healthy()
    s.enqueue([5], None, outcome="fail")
    s.consume([(105, 5)])
    s.drain()
    r = check(s.ops)
    assert not r.valid
    assert r.failed == 1 and r.failed_but_seen == 1


def test_an_item_delivered_never_acked_and_no_longer_queued_is_unsettled():
    s = healthy()
    s.enqueue([5], [105])
    s.dequeue([(105, 5)])  # the consumer never acks it, yet the queue ends up empty
    s.drain()
    r = check(s.ops)
    assert not r.valid
    assert r.unsettled == 1 and r.examples["unsettled"] == [105]


def test_acks_with_lost_leases_settle_only_the_acked_part():
    s = healthy()
    s.enqueue([5, 6], [105, 106])
    s.dequeue([(105, 5), (106, 6)])
    s.ack([105, 106], outcome="fail", value={"acked": [105], "lost": [106], "unknown": []})
    assert check(s.ops).unsettled == 1  # 106 is not settled until someone acks it
    s.dequeue([(106, 6)], process="consumer-1")
    s.ack([106], outcome="info", process="consumer-1")  # outcome unknown: may have landed
    s.drain()
    r = check(s.ops)
    assert r.valid, r.problems
    assert r.acks == {"ok": 2, "fail": 1, "info": 1}


def test_the_queue_must_be_empty_after_the_drain():
    s = healthy()
    s.drain(ready=3)
    r = check(s.ops)
    assert not r.valid and any("not empty" in p for p in r.problems)
    assert not check(healthy().ops).valid  # no drain recorded at all


def test_a_server_that_died_on_its_own_fails_the_run():
    s = healthy()
    s.op("monitor", "info", "crash", {"process": "datanode2", "status": 70, "log": "..."})
    s.drain()
    r = check(s.ops)
    assert not r.valid and r.crashes == 1


def test_a_run_that_moved_nothing_proves_nothing():
    s = Story()
    s.drain()
    assert not check(s.ops).valid


# -- schedule ------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_schedule():
    kw = dict(datanodes=5, consumers=2, plan=FaultPlan(churn_per_min=6))
    assert make_schedule(7, 60, **kw) == make_schedule(7, 60, **kw)
    assert make_schedule(7, 60, **kw) != make_schedule(8, 60, **kw)


@pytest.mark.parametrize("seed", range(20))
def test_a_schedule_honours_the_plan_and_the_timeouts(seed):
    t = Timing()
    plan = FaultPlan(churn_per_min=10)
    faults = make_schedule(seed, 60, datanodes=5, consumers=2, plan=plan, timing=t)
    kinds = [f.kind for f in faults]
    for kind, n in plan.counts().items():
        assert kinds.count(kind) == n
    assert kinds.count(STALL_CONSUMER) == plan.consumer_stalls
    for lane in ("cluster", "churn", "consumers"):
        mine = [f for f in faults if f.lane == lane]
        for a, b in pairwise(mine):
            assert a.at_s + a.duration_s <= b.at_s, f"{lane} faults overlap: {a} {b}"
    for f in faults:
        assert t.warmup_s <= f.at_s and f.at_s + f.duration_s <= 60 - t.cooldown_s
        if f.kind == PAUSE_NODE:
            assert f.duration_s > t.dead_after_s
        if f.kind in (PAUSE_MASTER, STALL_CONSUMER):
            assert f.duration_s > t.lease_s
        assert (f.target is None) == (f.kind in (KILL_MASTER, PAUSE_MASTER))
        if f.target is not None:
            assert 0 <= f.target < (2 if f.kind == STALL_CONSUMER else 5)


def test_churn_follows_its_rate():
    faults = make_schedule(3, 600, datanodes=5, consumers=2,
                           plan=FaultPlan(node_kills=0, node_wipes=0, master_kills=0,
                                          node_pauses=0, master_pauses=0, consumer_stalls=0,
                                          churn_per_min=6))
    assert {f.kind for f in faults} == {CHURN}
    assert 35 <= len(faults) <= 75  # about 60 in 10 minutes


def test_more_faults_than_the_run_can_hold_are_refused():
    with pytest.raises(ValueError, match="lengthen the run"):
        make_schedule(1, 20, datanodes=5, consumers=2, plan=FaultPlan(node_kills=20))


# -- payloads, history, report ---------------------------------------------------------------


def test_payloads_carry_their_sequence_number_and_checksum():
    data = payload.make(5, 42)
    assert data == payload.make(5, 42) and data != payload.make(6, 42)
    got = payload.parse(data)
    assert (got.seq, got.intact, got.digest) == (42, True, payload.digest(data))
    assert payload.parse(data[:-1] + bytes([data[-1] ^ 1])).intact is False
    assert payload.parse(b"garbage").seq is None


def test_history_round_trips_and_skips_a_torn_last_line(tmp_path):
    path = str(tmp_path / "history.jsonl")
    with history.History(path) as h:
        h.invoke("producer-0", "enqueue", {"seqs": [1], "digests": ["d"]})
        h.record("producer-0", "info", "enqueue", {"seqs": [1], "ids": [9]}, "MasterUnavailable")
    with open(path, "a") as f:
        f.write('{"index": 2, "ti')
    ops = list(history.read(path))
    assert [(o["index"], o["type"]) for o in ops] == [(0, "invoke"), (1, "info")]
    assert ops[1]["error"] == "MasterUnavailable" and ops[1]["value"]["ids"] == [9]


def test_the_report_shows_faults_backlog_and_figures(tmp_path):
    s = healthy()
    s.op("nemesis", "invoke", "kill_node", {"fault": 0, "target": 2, "duration_s": 1.0})
    s.op("nemesis", "ok", "kill_node", {"fault": 0, "target": 2, "duration_s": 1.0})
    s.op("nemesis", "invoke", "heal", {"fault": 0, "kind": "kill_node"})
    s.op("nemesis", "ok", "heal", {"fault": 0, "kind": "kill_node"})
    s.drain()
    tl = report.timeline(s.ops)
    assert [(f["kind"], f["target"]) for f in tl.faults] == [("kill_node", 2)]
    assert max(n for _, n in tl.unseen) == 5 and tl.unseen[-1][1] == 0
    result = check(s.ops)
    options = dict(seed=1, duration_s=60.0, datanodes=5, replication=3, heartbeat_s=0.2,
                   dead_after_s=1.5, lease_s=2.0)
    figures = report.figures(result, {"run_dir": str(tmp_path), "runtime_s": 1.0,
                                      "options": options}, tl)
    text = report.write(str(tmp_path), figures)
    assert "PASS" in text and "lost 0" in text and len(text.splitlines()) < 25
    assert json.loads((tmp_path / "report.json").read_text())["checker"]["acknowledged"] == 5
    report.plot(tl, [{"time": 0.0, "under_replicated": 0}, {"time": 0.1, "under_replicated": None}],
                str(tmp_path / "timeline.png"), "test")
    assert (tmp_path / "timeline.png").stat().st_size > 1000


# -- a real run ------------------------------------------------------------------------------


@pytest.mark.cluster
def test_a_short_chaos_run_passes_the_checker(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "chaos", "run", "--seed", "1", "--duration-s",
           str(CHAOS_DURATION_S), "--run-dir", str(run_dir), "--log-level", "warning"]
    if CHAOS_DURATION_S < 60:  # the default mix of faults needs about a minute
        cmd += ["--scale-faults"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHAOS_DURATION_S + 120)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr[-5000:])
        for log in sorted((run_dir / "cluster").glob("*.log")):
            print(f"===== {log.name}\n{log.read_text(errors='replace')[-3000:]}")
    assert proc.returncode == 0
    figures = json.loads((run_dir / "report.json").read_text())
    checker = figures["checker"]
    assert figures["valid"] and checker["lost"] == 0 and checker["unexpected"] == 0
    assert checker["acknowledged"] > 1000
    assert sum(figures["faults_applied"].values()) >= 5
    assert (run_dir / "timeline.png").exists() and (run_dir / "summary.txt").exists()
    jobs = figures["jobs"]  # a schedule and dependency chains ran under the same faults
    assert jobs["valid"] and jobs["ticks_armed"] >= 10 and jobs["chains"] >= 10
    assert not any(jobs["ticks_armed_twice"].values()) and not jobs["order_violations"]


@pytest.mark.cluster
def test_a_short_sharded_chaos_run_passes_with_shard_masters_killed(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "chaos", "run", "--masters", "3", "--datanodes", "4",
           "--seed", "3", "--duration-s", "30", "--scale-faults", "--master-kills", "4",
           "--run-dir", str(run_dir), "--log-level", "warning"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr[-5000:])
    assert proc.returncode == 0
    figures = json.loads((run_dir / "report.json").read_text())
    checker = figures["checker"]
    assert figures["valid"] and checker["lost"] == 0 and checker["unexpected"] == 0
    assert checker["acknowledged"] > 1000 and checker["ids_reused"] == 0
    kills = [f for f in figures["master_faults"] if f["kind"] == "kill_master"]
    assert kills and all(f["shard"] in (0, 1, 2) and f["first_ack_after_s"] is not None
                         for f in kills)
    assert "3 shards of 4 data nodes" in (run_dir / "summary.txt").read_text()
