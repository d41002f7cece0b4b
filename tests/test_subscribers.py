"""``master/shard/subscribers.py`` without processes: what a heads subscription is answered with,
and what is left after connections unsubscribe, leave or are cut."""

from __future__ import annotations

import pytest

from master.shard.subscribers import CUT, OK, REFUSED, Subscribers, is_topic


def t(name: str) -> bytes:
    return name.encode() + b"\0"


@pytest.mark.parametrize("topic, valid", [
    (b"", True), (t("jobs"), True), (t("a" * 200), True), (t("jobs.dead"), True),
    (b"jobs", False), (t("a" * 201), False), (t("no space"), False), (t("jöbs"), False),
    (b"\xff\0", False), (t(""), False),
])
def test_only_a_queues_topic_or_everything_is_a_topic(topic, valid):
    assert is_topic(topic) is valid


def test_a_connection_asking_past_its_share_or_for_no_topic_is_cut():
    subs = Subscribers(per_connection=2)
    assert [subs.subscribe(7, t(q), True) for q in ("a", "b")] == [OK, OK]
    assert subs.subscribe(7, t("a"), True) == REFUSED  # asked already: nothing to do
    assert subs.subscribe(7, t("c"), True) == CUT
    subs.cutting(7)
    assert subs.count == 0 and not subs and subs.cut == 1
    assert subs.subscribe(7, t("d"), True) == REFUSED  # what a cut connection still sent
    subs.gone(7)  # its departure: the descriptor may serve a new connection
    assert subs.subscribe(7, t("d"), True) == OK
    assert subs.subscribe(8, b"jobs", True) == CUT


def test_topics_of_no_queue_are_capped_in_all_and_a_connection_refused_too_often_is_cut():
    subs = Subscribers(unknown=2, most_held=1)
    assert [subs.subscribe(1, t(q), False) for q in ("x", "y")] == [OK, OK]
    assert subs.subscribe(2, t("x"), False) == OK  # a topic listened to already costs nothing
    assert subs.subscribe(2, t("z"), False) == REFUSED
    assert subs.subscribe(2, t("jobs"), True) == OK  # an existing queue's: not that cap
    assert subs.subscribe(2, t("w"), False) == CUT  # a second refusal held at once
    assert subs.refused == 2 and subs.listeners == {t("x"): 2, t("y"): 1, t("jobs"): 1}


def test_leaving_and_unsubscribing_free_everything():
    subs = Subscribers()
    for fd in (1, 2):
        assert subs.subscribe(fd, t("jobs"), True) == OK
    assert subs.subscribe(2, b"", True) == OK
    assert subs.count == 3 and subs.listened(t("jobs")) and subs.listened(b"")
    assert subs.unsubscribe(2, b"") and not subs.unsubscribe(2, b"")
    subs.gone(1)
    assert subs.count == 1 and subs.listeners == {t("jobs"): 1}
    subs.gone(2)
    assert subs.count == 0 and not subs and subs.applied == {} and subs.held == {}
