"""The lease keeper the worker and the dispatcher share (``blizzard/client/lease_keeper.py``):
which leases are due, and what an extension's answer makes of them. No cluster, no clock:
every time is given."""

from __future__ import annotations

from typing import Any

import pytest

from blizzard.client.lease_keeper import (
    EXTEND_AT,
    EXTEND_RETRY_S,
    Extended,
    Held,
    LeaseKeeper,
    extension,
)
from blizzard.wire.errors import InvalidArgument, LeaseExpired, MasterUnavailable


def held(lease_s: float, deadline: float, n: int = 1) -> Held:
    return Held(msg=f"job {n}", lease_s=lease_s, deadline=deadline)  # type: ignore[arg-type]


def kept(*leases: Held) -> LeaseKeeper:
    keeper = LeaseKeeper()
    for lease in leases:
        keeper.hold(lease)
    return keeper


def test_a_lease_is_due_when_a_third_of_it_is_left_and_not_before():
    # Given a 30 s lease taken at 100 (it ends at 130)
    lease = held(30.0, 130.0)
    keeper = kept(lease)
    assert keeper.next_at == pytest.approx(120.0)
    # Then before 120 nothing is due, and the keeper does not even look
    assert keeper.due([lease], 119.9) == {}
    # ... and from 120 it is, grouped by its length
    assert keeper.due([lease], 120.1) == {30.0: [lease]}


def test_leases_not_due_set_when_the_keeper_looks_next():
    short, long = held(3.0, 103.0, 1), held(30.0, 130.0, 2)
    keeper = kept(short, long)
    assert keeper.due([short, long], 102.5) == {3.0: [short]}
    assert keeper.next_at == pytest.approx(120.0)  # the long one, then


def test_an_extension_answered_moves_the_deadlines_and_clears_doubt():
    lease = held(30.0, 130.0)
    lease.doubtful = True
    keeper = kept(lease)
    keeper.due([lease], 121.0)
    keeper.take([lease], 30.0, 121.0, Extended.ALL)
    assert (lease.deadline, lease.doubtful) == (151.0, False)
    assert keeper.next_at == pytest.approx(141.0)
    assert lease.sure(121.0)


def test_an_extension_with_a_lease_lost_extends_the_others_but_doubts_all():
    # the master does not say which were lost
    a, b = held(30.0, 130.0, 1), held(30.0, 130.0, 2)
    keeper = kept(a, b)
    keeper.take([a, b], 30.0, 121.0, Extended.SOME_LOST)
    assert [(h.deadline, h.doubtful) for h in (a, b)] == [(151.0, True)] * 2
    assert not a.sure(121.0)


def test_an_unanswered_extension_keeps_the_deadline_and_is_tried_again_soon():
    lease = held(30.0, 130.0)
    keeper = kept(lease)
    keeper.due([lease], 121.0)
    keeper.take([lease], 30.0, 121.0, Extended.UNANSWERED)
    assert (lease.deadline, lease.doubtful) == (130.0, True)
    assert keeper.next_at == pytest.approx(121.0 + EXTEND_RETRY_S)
    # a short lease is tried again sooner than EXTEND_RETRY_S: a quarter of its last third
    short = held(1.2, 101.2)
    keeper = kept(short)
    assert keeper.due([short], 101.0) == {1.2: [short]}
    keeper.take([short], 1.2, 101.0, Extended.UNANSWERED)
    assert keeper.next_at == pytest.approx(101.0 + 1.2 * EXTEND_AT / 4)


def test_a_lease_is_sure_only_with_time_to_spare():
    lease = held(30.0, 130.0)
    assert lease.sure(124.0)  # 6 s left: more than half of the last third
    assert not lease.sure(126.0)


class Send:
    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.calls = error, []

    def __call__(self, msgs: list[Any], lease_s: float) -> None:
        self.calls.append((msgs, lease_s))
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("error, answer", [
    (None, Extended.ALL),
    (LeaseExpired("items [1] were not leased"), Extended.SOME_LOST),
    (MasterUnavailable("no answer"), Extended.UNANSWERED),
])
def test_extension_names_what_the_answer_says(error, answer):
    send = Send(error)
    assert extension(send, [held(30.0, 130.0, 7)], 30.0) is answer
    assert send.calls == [(["job 7"], 30.0)]


def test_an_extension_refused_for_another_reason_is_raised():
    with pytest.raises(InvalidArgument):
        extension(Send(InvalidArgument("lease_s too long")), [held(30.0, 130.0)], 30.0)


def test_extend_due_sends_one_call_per_lease_length(monkeypatch):
    import blizzard.client.lease_keeper as lk
    monkeypatch.setattr(lk.time, "monotonic", lambda: 125.0)
    a, b, c = held(30.0, 130.0, 1), held(30.0, 131.0, 2), held(60.0, 200.0, 3)
    keeper, send = kept(a, b, c), Send()
    keeper.extend_due([a, b, c], send)
    assert send.calls == [(["job 1", "job 2"], 30.0)]
    assert (a.deadline, b.deadline, c.deadline) == (155.0, 155.0, 200.0)
