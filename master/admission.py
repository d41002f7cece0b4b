"""Which ready items a rate-limited lease may take: redeliveries freely, new items by token.

A queue's token bucket limits how fast new work goes out (the c12s task queue's rule, the
seed of ``blizzard dispatch``). An item that has been delivered before (``attempts`` > 0: it
was nacked, its lease ran out, or its consumer gave it back) already had its token; making it
wait for another would stretch the back-off its retry policy asked for, so it passes without
one. Redriven items start again at zero attempts and take a token.

The walk is the queue's serving order, as ``State.head`` walks it: a redelivery behind new
items the bucket holds back is found within ``SCAN_PAST_LIMIT`` entries past them (retried
items keep their id, so they sort ahead of newer work of the same priority).
"""

from __future__ import annotations

import heapq

from master.state import State

SCAN_PAST_LIMIT = 128  # heap entries looked at for redeliveries once the tokens ran out


def take_admitted(state: State, name: str, n: int, tokens: int,
                  now: float) -> tuple[list[int], int]:
    """Up to ``n`` ids a lease may take now, at most ``tokens`` of them new; and how many are.

    Like ``State.head`` it changes no durable state: popped entries go back on the heap, and an
    item whose key is leased (or taken earlier in this batch) is passed over.
    """
    q = state.queues.get(name)
    if q is None:
        return [], 0
    state.promote_due(q, now)
    heap, items = q.ready, state.items
    popped, taken, keys = [], [], set()
    fresh, skipped = 0, 0
    while heap and len(taken) < n and skipped <= SCAN_PAST_LIMIT:
        item = heapq.heappop(heap)
        if items.get(item.id) is not item:
            continue  # stale: leased, moved or forgotten since it was pushed
        popped.append(item)
        is_new = item.attempts == 0
        if is_new and fresh >= tokens:
            skipped += 1
            continue
        if item.key:
            if item.key in q.active or item.key in keys:
                continue
            keys.add(item.key)
        taken.append(item.id)
        fresh += is_new
    for item in popped:
        heapq.heappush(heap, item)
    return taken, fresh
