"""Micro-batches as columns: what the driver leased, and how it is split into partitions.

The driver keeps each lease reply (``protocol.Leased``) as it came: one list per field, no
object per item. ``plan_partitions`` cuts a batch into ``Run``s, contiguous slices of one reply
whose items share a replica set, and gives each run to one of the set's live nodes, balancing
the items each node serves; each node's runs make one ``NodePartition``. Pickling a partition
(Spark ships it to an executor) is then a few lists of numbers per run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from blizzard.client.message import LeasedItem
from blizzard.wire import protocol as p


@dataclass(eq=False)  # compared by identity: a batch is one lease's, however alike
class Batch:
    """One micro-batch: the lease replies that make it, oldest first."""

    replies: list[p.Leased]
    renewed: float = 0.0  # monotonic time its leases were taken or last extended
    plan: list[NodePartition] | None = None  # its partitions, planned when it was leased

    def __len__(self) -> int:
        return sum(len(r.ids) for r in self.replies)

    @property
    def ids(self) -> list[int]:
        return [i for r in self.replies for i in r.ids]


def settle_columns(batches: list[Batch]) -> tuple[list[int], list[int]]:
    """The ids and lease tokens of every item of ``batches``: what an ack or extend names."""
    return ([i for b in batches for r in b.replies for i in r.ids],
            [t for b in batches for r in b.replies for t in r.leases])


@dataclass
class Run:
    """Items of one lease reply that one data node serves first, column by column.

    ``nodes`` is the order to try their replicas in: the chosen node, the set's other live
    nodes, then the rest.
    """

    ids: list[int]
    leases: list[int]
    sizes: list[int]
    crcs: list[int]
    attempts: list[int]
    priorities: list[int]
    enqueued_at: list[float]
    keys: list[str]
    nodes: list[p.NodeRef]
    grant: p.GetGrant | None

    def __len__(self) -> int:
        return len(self.ids)

    def item(self, k: int) -> LeasedItem:
        """Item ``k`` as a ``LeasedItem`` (for the client's read with fail-over)."""
        return LeasedItem(self.ids[k], self.leases[k], self.sizes[k], self.crcs[k],
                          self.attempts[k], self.priorities[k], self.enqueued_at[k], self.nodes,
                          self.keys[k], self.grant)


class NodePartition(InputPartition):
    """The runs of one micro-batch that one data node (``value``, its address) serves first."""

    def __init__(self, addr: str, runs: list[Run]) -> None:
        super().__init__(addr)
        self.runs = runs

    def __len__(self) -> int:
        return sum(len(r) for r in self.runs)

    def __repr__(self) -> str:
        return f"NodePartition({self.value!r}, {len(self)} items in {len(self.runs)} runs)"


COLUMNS = ("ids", "leases", "sizes", "crcs", "attempts", "priorities", "enqueued_at", "keys")


def plan_partitions(batch: Batch, alive: set[str]) -> list[NodePartition]:
    """One partition per data node, each item served first by a live replica; every node's
    share evens out (items counted, as the items of a batch are of similar size)."""
    load: dict[str, int] = defaultdict(int)
    by_addr: dict[str, list[Run]] = defaultdict(list)
    for reply in batch.replies:
        for nodes, columns in _by_replica_set(reply):
            usable = [n for n in nodes if n.addr]
            live = [n for n in usable if n.node_id in alive] or usable
            if not live:  # no known replica: the executor gives these items back
                # (the ignores here and below: mypy cannot count the columns in ``*columns``)
                by_addr[""].append(Run(*columns, nodes=list(nodes), grant=reply.grant))  # type: ignore[misc, arg-type]
                continue
            start = 0
            for node, count in zip(live, _shares([load[n.node_id] for n in live],
                                                 len(columns[0])), strict=True):
                if count:
                    order = [node] + [n for n in live if n is not node] + \
                        [n for n in nodes if n not in live]
                    by_addr[node.addr].append(Run(*(c[start:start + count] for c in columns),  # type: ignore[misc, arg-type]
                                                  nodes=order, grant=reply.grant))
                    load[node.node_id] += count
                    start += count
    return [NodePartition(addr, runs) for addr, runs in by_addr.items()]


def _by_replica_set(reply: p.Leased) -> Iterator[tuple[list[p.NodeRef], list[list]]]:
    """The reply's columns split by replica set (one slice each when all items share one)."""
    columns = [getattr(reply, name) for name in COLUMNS]
    if len(reply.replica_sets) == 1:  # the master lists each set its items use once
        yield reply.replica_sets[0].nodes, columns
        return
    positions: dict[int, list[int]] = defaultdict(list)
    for k, s in enumerate(reply.replica_set):
        positions[s].append(k)
    for s, where in positions.items():
        yield reply.replica_sets[s].nodes, [[c[k] for k in where] for c in columns]


def _shares(loads: list[int], n: int) -> list[int]:
    """Split ``n`` items among nodes with these loads so the loads end as even as they can:
    the least loaded nodes are filled up to a common level, the others get nothing."""
    order = sorted(range(len(loads)), key=loads.__getitem__)
    m = len(loads)
    while m > 1 and (sum(loads[k] for k in order[:m]) + n) / m < loads[order[m - 1]]:
        m -= 1
    level = (sum(loads[k] for k in order[:m]) + n) / m
    shares = [0] * len(loads)
    for k in order[:m]:
        shares[k] = int(level - loads[k])
    for k in order[:n - sum(shares)]:  # what rounding down left, one each
        shares[k] += 1
    return shares
