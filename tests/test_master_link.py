"""The master link's retry pauses: exponential back-off with jitter (no processes)."""

from __future__ import annotations

from blizzard.client.master_link import FIRST_PAUSE_S, MAX_PAUSE_S, retry_pause_s


def test_retry_pauses_grow_to_a_cap_and_are_spread_by_jitter():
    assert retry_pause_s(0, 0.0) == FIRST_PAUSE_S / 2 and retry_pause_s(0, 0.999) < FIRST_PAUSE_S
    assert retry_pause_s(3, 0.5) == 2 * retry_pause_s(2, 0.5)
    assert retry_pause_s(50, 0.999) <= MAX_PAUSE_S and retry_pause_s(50, 0.0) == MAX_PAUSE_S / 2
    # clients retrying together are spread over half the step or more
    pauses = {retry_pause_s(5, r / 10) for r in range(10)}
    assert len(pauses) == 10 and max(pauses) - min(pauses) >= 0.4 * MAX_PAUSE_S * 0.9
