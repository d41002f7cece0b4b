"""The total-queue checker: did every acknowledged enqueue come out, and nothing else?

Semantics of Jepsen's ``total-queue`` checker, with items named by their payload sequence
number (see ``chaos.history`` for the ops):

- attempted: every item whose enqueue was invoked;
- lost: acknowledged enqueues never dequeued -- must be 0 (P1, P2);
- unexpected: dequeued items never attempted -- must be 0 (P3);
- recovered / not recovered: indeterminate enqueues that were / were not dequeued;
- duplicated: items dequeued more than once -- allowed (at least once), reported as a rate.

An item the master dead-lettered (leased more than the queue's ``max_attempts`` times) is
read from the dead-letter queue at the drain: it counts as dequeued, and as dead-lettered.

Blizzard promises more, so these must be 0 too: payload mismatches (P5), ids given to two
different items (P4), definitely failed enqueues that appeared anyway (P3), items delivered
but never acked that are no longer queued (P2), server processes that died on their own;
and the final drain must leave the queue empty.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.history import FAIL, INFO, INVOKE, OK

EXAMPLES = 20  # ids or seqs listed per anomaly


@dataclass
class CheckResult:
    """The checker's figures; ``valid`` is the verdict and ``problems`` says why not."""

    valid: bool = False
    attempted: int = 0
    acknowledged: int = 0
    failed: int = 0
    indeterminate: int = 0
    recovered: int = 0
    not_recovered: int = 0
    delivered: int = 0  # deliveries, repeats included
    dequeued: int = 0  # distinct items
    lost: int = 0
    unexpected: int = 0
    payload_mismatches: int = 0
    ids_reused: int = 0
    failed_but_seen: int = 0
    unsettled: int = 0
    dead_lettered: int = 0  # distinct items read from the dead-letter queue at the drain
    duplicated: int = 0
    duplicate_rate: float = 0.0  # duplicated / dequeued
    redeliveries: int = 0  # deliveries beyond each item's first
    acks: dict[str, int] = field(default_factory=dict)  # ack calls by outcome
    errors: dict[str, int] = field(default_factory=dict)  # "f type ErrorClass" -> calls
    final_queue: dict[str, int] | None = None
    crashes: int = 0
    examples: dict[str, list[Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check(ops: Iterable[dict[str, Any]]) -> CheckResult:
    """Judge a history (an iterable of ops, in order)."""
    attempts: dict[int, str] = {}  # seq -> digest of the payload sent
    outcome: dict[int, str] = {}  # seq -> ok / fail / info of its enqueue
    seqs_of_id: dict[int, set[int]] = {}
    deliveries: Counter[int] = Counter()
    delivered_ids: dict[int, int | None] = {}
    settled: set[int] = set()
    mismatches: list[Any] = []
    acks: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    dead: set[int | None] = set()
    r = CheckResult()

    for op in ops:
        f, kind, value = op.get("f"), op.get("type"), op.get("value") or {}
        if op.get("error") and op.get("process") != "nemesis":
            errors[f"{f} {kind} {op['error'].split(':', 1)[0]}"] += 1
        if f == "enqueue":
            if kind == INVOKE:
                attempts.update(zip(value["seqs"], value["digests"], strict=True))
            else:
                for seq in value["seqs"]:
                    outcome[seq] = kind
                ids = value.get("ids")  # none when the enqueue failed
                for item_id, seq in zip(ids, value["seqs"], strict=True) if ids else ():
                    seqs_of_id.setdefault(item_id, set()).add(seq)
        elif f == "dequeue" and kind == OK:
            if value.get("dead_letter"):
                dead.update(item[1] for item in value["items"])
            for item_id, seq, digest, intact, *_ in value["items"]:
                r.delivered += 1
                delivered_ids[item_id] = seq
                if seq is None or not intact or (seq in attempts and attempts[seq] != digest):
                    mismatches.append(item_id)
                if seq is not None:
                    deliveries[seq] += 1
                    seqs_of_id.setdefault(item_id, set()).add(seq)
        elif f == "ack" and kind != INVOKE:
            acks[kind] += 1
            if kind in (OK, INFO):
                settled.update(value["ids"])
            else:  # a partial failure: some leases were lost, the rest acked
                settled.update(value.get("acked", []))
                settled.update(value.get("unknown", []))
        elif f == "drain" and kind == OK:
            r.final_queue = {k: value[k] for k in ("ready", "delayed", "leased")}
            if value.get("left_in"):
                r.examples["left_in"] = value["left_in"]
        elif f == "crash":
            r.crashes += 1
            r.examples.setdefault("crashes", []).append(value)

    ok = {s for s, k in outcome.items() if k == OK}
    failed = {s for s, k in outcome.items() if k == FAIL}
    unknown = set(attempts) - ok - failed  # info, or never completed (the run was cut short)
    seen = set(deliveries)
    found = {
        "lost": sorted(ok - seen),
        "unexpected": sorted(seen - set(attempts)),
        "payload_mismatches": sorted(set(mismatches)),
        "ids_reused": sorted(i for i, seqs in seqs_of_id.items() if len(seqs) > 1),
        "failed_but_seen": sorted(failed & seen),
        "unsettled": sorted(set(delivered_ids) - settled),
    }
    for name, items in found.items():
        setattr(r, name, len(items))
        if items:
            r.examples[name] = items[:EXAMPLES]
    r.attempted, r.acknowledged, r.failed = len(attempts), len(ok), len(failed)
    r.indeterminate = len(unknown)
    r.recovered = len(unknown & seen)
    r.not_recovered = r.indeterminate - r.recovered
    r.dequeued = len(seen)
    r.dead_lettered = len(dead - {None})
    dup = [s for s, n in deliveries.items() if n > 1]
    r.duplicated = len(dup)
    r.duplicate_rate = round(len(dup) / len(seen), 6) if seen else 0.0
    r.redeliveries = sum(n - 1 for n in deliveries.values())
    r.acks = dict(acks)
    r.errors = dict(errors.most_common())
    if dup:
        r.examples["duplicated"] = sorted(dup)[:EXAMPLES]

    for name, items in found.items():
        if items:
            r.problems.append(f"{name.replace('_', ' ')}: {len(items)}")
    if r.crashes:
        r.problems.append(f"server processes died on their own: {r.crashes}")
    if r.final_queue is None:
        r.problems.append("no final drain recorded")
    elif any(r.final_queue.values()):
        r.problems.append(f"queue not empty after the final drain: {r.final_queue}")
    if not r.acknowledged or not r.dequeued:
        r.problems.append("nothing was acknowledged or dequeued: the run proves nothing")
    r.valid = not r.problems
    return r
