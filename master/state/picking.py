"""Which ready items a lease may take: the one walk of a queue's ready line, in serving order.

An item whose key is leased, or taken earlier in the same batch, is passed over (per-key
exclusivity). A rate-limited lease also gives ``new``: how many never-delivered items its
tokens admit. A queue's token bucket limits how fast new work goes out (the c12s task queue's
rule, the seed of ``blizzard dispatch``). An item that has been delivered before (``attempts``
> 0: it was nacked, its lease ran out, or its consumer gave it back) already had its token;
making it wait for another would stretch the back-off its retry policy asked for, so it passes
without one. Redriven items start again at zero attempts and take a token.

A redelivery behind new items the bucket holds back is found within ``SCAN_PAST_LIMIT``
entries past them (retried items keep their id, so they sort ahead of newer work of the same
priority).
"""

from __future__ import annotations

from typing import Any

from master.state.item import Item

SCAN_PAST_LIMIT = 128  # entries looked at for redeliveries once the tokens ran out


def head(state: Any, name: str, n: int, now: float, new: int | None = None) -> list[int]:
    """Up to ``n`` ids a lease would take now from ``state`` (a ``State``: the walk is its
    ``head``); with ``new`` given, at most that many of them never delivered before.

    A query: it changes no durable state, and popped entries go back in front of the line
    (stale ones, leased or moved since they were pushed, are dropped).
    """
    q = state.queues.get(name)
    if q is None:
        return []
    state.promote_due(q, now)
    line, current = q.ready, state.items.get
    popped: list[Item] = []
    taken: list[int] = []
    keys: set[str] = set()
    skipped = 0
    tokens = 0 if new is None else new  # never-delivered items it may still take (with ``new``)
    for item in line.popping() if n > 0 else ():
        if current(item.id) is not item:
            continue  # stale: leased, moved or forgotten since it was pushed
        popped.append(item)
        needs_token = new is not None and item.attempts == 0
        if needs_token and tokens <= 0:
            skipped += 1
            if skipped > SCAN_PAST_LIMIT:
                break
            continue
        if item.key:
            if item.key in q.active or item.key in keys:
                continue
            keys.add(item.key)
        taken.append(item.id)
        if needs_token:
            tokens -= 1
        if len(taken) == n:
            break
    line.put_back(popped)
    return taken
