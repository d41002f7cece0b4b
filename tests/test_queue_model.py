"""The master's queue semantics against a small reference model (hypothesis).

Random enqueues with priorities, delays and keys (some coalescing), leases, acks, nacks,
lease expiries and clock steps drive the real ``State`` (through the records the master
would log) and a plain-Python model side by side; after every step the served order, key
exclusivity, attempts and dead-lettering must agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from master.state.machine import LEASED, State
from master.state.queue_config import QueueConfig
from master.state.records import AckItems, CommitItems, ConfigureQueue, LeaseItems, ReleaseItems

CONFIG = QueueConfig(lease_s=5.0, max_attempts=2, dead_letter="", backoff_base_s=1.0,
                     backoff_cap_s=4.0)


@dataclass
class M:
    """The model's item."""

    id: int
    queue: str
    priority: int
    order: int
    key: str
    visible_at: float
    attempts: int = 0
    leased_until: float | None = None


class Model:
    def __init__(self) -> None:
        self.items: dict[int, M] = {}

    def waiting(self, queue: str, key: str) -> list[M]:
        return [m for m in self.items.values()
                if m.queue == queue and m.key == key and m.leased_until is None]

    def commit(self, ids, prio, delay, key, coalesce, now) -> None:
        for i in ids:
            m = M(i, "q", prio, i, key, now + delay if delay else 0.0)
            if coalesce and key:
                for old in self.waiting("q", key):
                    m.priority = min(m.priority, old.priority)
                    m.order = min(m.order, old.order)
                    del self.items[old.id]
            self.items[i] = m

    def head(self, queue: str, n: int, now: float) -> list[int]:
        busy = {m.key for m in self.items.values()
                if m.queue == queue and m.key and m.leased_until is not None}
        ready = sorted((m for m in self.items.values() if m.queue == queue
                        and m.leased_until is None and m.visible_at <= now),
                       key=lambda m: (m.priority, m.order))
        out = []
        for m in ready:
            if len(out) == n:
                break
            if m.key and m.key in busy:
                continue
            busy.add(m.key) if m.key else None
            out.append(m.id)
        return out

    def release(self, i: int, not_before: float) -> None:
        m = self.items[i]
        m.leased_until = None
        m.attempts += 1
        limit = CONFIG.max_attempts if m.queue == "q" else QueueConfig().max_attempts
        if m.attempts >= limit and m.queue == "q":
            m.queue, m.visible_at = "q.dead", 0.0
        else:
            m.visible_at = not_before


steps = st.lists(st.one_of(
    st.tuples(st.just("enqueue"), st.integers(1, 3), st.integers(0, 2), st.sampled_from([0.0, 2.0]),
              st.sampled_from(["", "a", "b"]), st.booleans()),
    st.tuples(st.just("lease"), st.sampled_from(["q", "q.dead"]), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.integers(0, 99)),
    st.tuples(st.just("nack"), st.integers(0, 99), st.sampled_from([None, 0.0, 3.0])),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.5, 6.0])),
), max_size=50)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_state_machine_matches_the_model(script):
    state, model = State(), Model()
    state.apply(ConfigureQueue("q", CONFIG.lease_s, CONFIG.max_attempts, "", CONFIG.backoff_base_s,
                               CONFIG.backoff_cap_s, 0.0, 0))
    now, next_id, lease_seq = 100.0, 1, 0

    def leased_ids() -> list[int]:
        return sorted(i for i, it in state.items.items() if it.status == LEASED)

    def release(ids, delay):
        # what the master does on a nack (delay given) or an expiry / nack without delay
        nbs = []
        for i in ids:
            d = delay if delay is not None else CONFIG.backoff_s(state.items[i].attempts + 1)
            nbs.append(now + d if d > 0 else 0.0)
        state.apply(ReleaseItems(ids=ids, not_befores=nbs, error="e"))
        for i, nb in zip(ids, nbs, strict=True):
            model.release(i, nb)

    for step in script:
        kind = step[0]
        if kind == "enqueue":
            _, n, prio, delay, key, coalesce = step
            coalesce = coalesce and bool(key)
            ids = list(range(next_id, next_id + n))
            next_id += n
            state.apply(CommitItems("q", ids, [1] * n, [0] * n, [prio] * n,
                                    [now + delay if delay else 0.0] * n, [key] * n, coalesce,
                                    ["dn"], now, ""))
            model.commit(ids, prio, delay, key, coalesce, now)
        elif kind == "lease":
            _, queue, n = step
            got = state.head(queue, n, now)
            assert got == model.head(queue, n, now)
            if got:
                leases = list(range(lease_seq + 1, lease_seq + 1 + len(got)))
                lease_seq += len(got)
                state.apply(LeaseItems(got, leases, now + CONFIG.lease_s, ""))
                for i in got:
                    model.items[i].leased_until = now + CONFIG.lease_s
        elif kind in ("ack", "nack") and (held := leased_ids()):
            target = held[step[1] % len(held)]
            if kind == "ack":
                state.apply(AckItems([target]))
                del model.items[target]
            else:
                release([target], step[2])
        elif kind == "tick":
            now += step[1]
            expired = state.expired(now)
            ran_out = [i for i, m in model.items.items()
                       if m.leased_until is not None and m.leased_until <= now]
            assert sorted(expired) == sorted(ran_out)
            if expired:
                release(expired, None)
        # after every step: same items, queues, attempts; one leased item per key at most
        assert {i: (it.queue, it.attempts) for i, it in state.items.items()} == \
            {i: (m.queue, m.attempts) for i, m in model.items.items()}
        for queue in ("q", "q.dead"):
            keys = [it.key for it in state.items.values()
                    if it.queue == queue and it.key and it.status == LEASED]
            assert len(keys) == len(set(keys))
    for queue in ("q", "q.dead"):
        assert state.head(queue, 100, now + 1000) == model.head(queue, 100, now + 1000)
