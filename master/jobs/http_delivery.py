"""What task delivery asks of the master: items' states by id, burying, counts by task state.

``blizzard dispatch`` (``blizzard/dispatch/deliver.py``) delivers items as HTTP tasks with their own
retry policy. It needs three things no other consumer does: to say what became of one task
(``Lookup``: ``blizzard task ID``), to give up on a task before its queue would
(``Bury``: its own max attempts are spent), and a queue's items counted by task state
(``TaskStats``). Lookups and counts only read; a bury logs one ``BuryItems`` record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from blizzard.wire import protocol as p
from master.consume.leases import MAX_ERROR
from master.consume.schedule_runs import ScheduleRuns
from master.rules import arguments
from master.state.counts import QueueCounts
from master.state.item import DELAYED, LEASED
from master.state.machine import State
from master.state.records import BuryItems, ReleaseItems

LOOKUP_ERROR_BYTES = 4 * 1024 * 1024  # the most a Lookup reply spends on error texts
MIN_ERROR_SHOWN = 100  # characters of each error shown, however many ids were asked
MIN_REBURY_S = 1.0  # an already dead item buried again is back in its queue no sooner


class Tasks:
    """Handlers of ``Lookup``, ``Bury`` and ``TaskStats``."""

    def __init__(self, state: State, log_record: Callable[[Any], None],
                 counts: QueueCounts, schedule_runs: ScheduleRuns) -> None:
        self.state = state
        self.log = log_record
        self.counts = counts
        self.schedule_runs = schedule_runs  # a schedule's item is re-armed, not buried

    def lookup(self, msg: p.Lookup, now: float, *_: Any) -> p.ItemStates:
        arguments.batch(len(msg.ids), "ids")
        ids = list(dict.fromkeys(msg.ids))  # a repeated id is answered once
        # the errors' share of the reply is bounded, however many ids (a char is up to 4 bytes)
        cut = min(MAX_ERROR, max(MIN_ERROR_SHOWN, LOOKUP_ERROR_BYTES // (4 * max(1, len(ids)))))
        rows = [self.describe(item_id, now, cut) for item_id in ids]
        return p.ItemStates(ids, *(list(column) for column in zip(*rows, strict=True)))

    def describe(self, item_id: int, now: float,
                 cut: int = MAX_ERROR) -> tuple[str, str, int, str, float]:
        """One item's (state, queue, attempts, last error cut to ``cut`` characters, until)
        as ``ItemStates`` has them."""
        state = self.state
        item = state.items.get(item_id)
        if item is None:
            # an ack forgets the item; the master remembers only that it was acked, recently
            return ("succeeded" if item_id in state.recent_acks else "unknown", "", 0, "", 0.0)
        error = state.errors.get(item_id, "")[:cut]
        until = 0.0
        if item_id in state.origins:
            kind = "failed"
        elif item.status == LEASED:
            kind, until = "in_flight", state.held[item_id][1]
        elif item.status == DELAYED and state.delays[item_id] > now:
            kind, until = "scheduled", state.delays[item_id]
        else:  # ready, or delayed with its time come (promoted on the next lease)
            kind = "queued"
        return kind, item.queue, item.attempts, error, until

    def bury(self, msg: p.Bury, now: float, *_: Any) -> p.Acked:
        """Leased items die now; an id not held under the token given is reported lost.

        An item already dead (leased from a dead-letter queue) has nowhere further to go: it
        goes back to where it is after that queue's back-off, as a nack would send it, so a
        dispatcher draining a dead-letter queue does not bury the same items in a tight loop.
        """
        arguments.batch(arguments.same_length(ids=msg.ids, leases=msg.leases))
        if msg.priority is not None:
            arguments.priority(msg.priority)
        held: list[int] = []
        lost: list[int] = []
        for item_id, lease in dict(zip(msg.ids, msg.leases, strict=True)).items():
            (held if self.state.lease_of(item_id) == lease else lost).append(item_id)
        if held:  # a schedule's run given up: its next tick
            again, held = self.schedule_runs.split(held)
            self.schedule_runs.rearm(again, now, msg.error[:MAX_ERROR] or "buried")
        if held:
            items, origins, error = self.state.items, self.state.origins, msg.error[:MAX_ERROR]
            self.counts.add_each("nacked", [items[i].queue for i in held])
            dying = [i for i in held if i not in origins]
            dead = [i for i in held if i in origins]  # before the bury below adds to origins
            self.counts.add_each("dead_lettered", [items[i].queue for i in dying])
            new = [] if msg.priority is None else [msg.priority]
            if dying:
                self.log(BuryItems(ids=dying, error=error, priorities=new * len(dying)))
            if dead:
                backoffs = [self.state.config(items[i].queue).backoff_s(items[i].attempts + 1)
                            for i in dead]
                self.log(ReleaseItems(ids=dead, error=error,
                                      not_befores=[now + max(b, MIN_REBURY_S) for b in backoffs],
                                      priorities=new * len(dead)))
        return p.Acked(done=len(held), lost=lost)

    def task_stats(self, msg: p.TaskStats, now: float, *_: Any) -> p.TaskCounts:
        name = arguments.queue_name(msg.queue)
        config = self.state.config(name)
        dead_q = self.state.queues.get(config.dead_letter_queue(name))
        failed = dead_q.n_ready + dead_q.n_delayed + dead_q.n_leased if dead_q is not None else 0
        succeeded = self.counts.get("acked", name)
        q = self.state.queues.get(name)
        if q is None:
            return p.TaskCounts(name, 0, 0, 0, succeeded, failed)
        self.state.promote_due(q, now)
        return p.TaskCounts(name, q.n_ready, q.n_delayed, q.n_leased, succeeded, failed)
