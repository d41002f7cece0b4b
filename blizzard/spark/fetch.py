"""The executor side of the streaming read: fetch a partition's payloads from data nodes.

A partition holds runs of leased items that one data node serves first (``plan.py``).
``read_partition`` opens its own ``Client`` (clients are never pickled) and reads each chunk of
a run with one ``Get`` to that node (``DatanodePool.read_from``); whatever that did not bring
back intact goes through the client's read with replica fail-over (``Client.fetch``). Both
check sizes and checksums (P5) with the client's one check (``blizzard.client.datanodes``).
Each chunk becomes an Arrow record batch in ``SCHEMA``, built column by column. An item no
replica can serve is given back to the queue; if even that fails, the task fails, so the batch
is never acked without it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.pandas.types import to_arrow_schema

from blizzard.client.core import Client, ShardedClient
from blizzard.client.datanodes import NodeRead
from blizzard.spark.options import ReadOptions
from blizzard.spark.plan import NodePartition, Run
from blizzard.spark.schema import SCHEMA
from blizzard.spark.timings import Timings
from blizzard.wire.errors import NOT_HELD, ClusterError
from blizzard.wire.shard_messages import shard_of

log = logging.getLogger(__name__)

ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
FETCH_ITEMS = 2000  # items per data-node read
FETCH_BYTES = 8 * 1024 * 1024
GRANT_MARGIN_S = 2.0  # a read grant ending sooner than this is renewed before a read
UNREADABLE_DELAY_S = 1.0  # an item no replica could serve returns to the queue after this


def read_partition(opts: ReadOptions, part: NodePartition) -> Iterator[pa.RecordBatch]:
    """Fetch a partition's payloads in chunks and yield them as Arrow record batches."""
    client: Client | ShardedClient = Client(opts.master, timeout_s=opts.timeout_s,
                                            node_timeout_s=opts.node_timeout_s)
    readers: dict[int, _RunReader] = {}  # sharded: a run is read through its shard's client
    timings = Timings(opts.timings_dir, "executor")
    spent = dict.fromkeys(("executor fetch", "Arrow", "Spark consumes"), 0.0)
    clock = time.monotonic
    began = clock()
    try:
        for run in part.runs:
            k = shard_of(run.ids[0]) if isinstance(client, ShardedClient) and run.ids else -1
            reader = readers.get(k) or readers.setdefault(
                # k >= 0 only for a ShardedClient, which mypy cannot tell from k
                k, _RunReader(client.shards[k] if k >= 0 else client))  # type: ignore[union-attr, arg-type]
            for start, end in _chunks(run.sizes):
                t0 = clock()
                got = reader.read(run, start, end)
                t1 = clock()
                spent["executor fetch"] += t1 - t0
                if got:
                    rows = to_arrow(opts.queue, run, start, end, got)
                    t2 = clock()
                    spent["Arrow"] += t2 - t1
                    yield rows  # Spark converts and writes it before asking for the next
                    spent["Spark consumes"] += clock() - t2
    finally:
        client.close()
        for stage, seconds in spent.items():
            timings.add(stage, seconds, len(part))
        timings.add("executor task", clock() - began, len(part))


class _RunReader:
    """Reads chunks of runs: one ``Get`` to the run's first node when all goes well, the
    client's read with replica fail-over for whatever that did not bring back intact. A node
    that timed out is one the client avoids for a while (``Client.suspected``): its chunks go
    to the fail-over read, which tries the other replicas first.

    A run's read grant ends with the leases it came with; one about to end (or refused as
    such) is renewed first (``Regrant``). Items the master says are no longer leased to this
    batch are skipped: another consumer has them now.
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.lost: set[int] = set()  # ids no longer leased to this batch

    def read(self, run: Run, start: int, end: int) -> dict[int, bytes]:
        if run.grant is not None and run.grant.expiry < time.time() + GRANT_MARGIN_S:
            self._renew(run)
        positions = [k for k in range(start, end) if run.ids[k] not in self.lost] \
            if self.lost else list(range(start, end))
        got: dict[int, bytes] = {}
        rest = positions
        first = run.nodes[0]
        if positions and first.addr and first.node_id not in self.client.suspected():
            got, rest = self._direct(run, positions)
        if rest:
            got.update(self._with_failover(run, rest))
        return got

    def _direct(self, run: Run, positions: list[int]) -> tuple[dict[int, bytes], list[int]]:
        """One Get to the run's first node (the client's ``read_from``, which checks size and
        CRC); returns the intact payloads and the positions of the items it did not bring
        back intact."""
        read = self._get(run, positions)
        if read.forbidden and self._renew(run):
            positions = [k for k in positions if run.ids[k] not in self.lost]
            read = self._get(run, positions) if positions else NodeRead({}, [])
        return read.payloads, [positions[i] for i in read.rest]

    def _get(self, run: Run, positions: list[int]) -> NodeRead:
        return self.client.datanodes.read_from(
            run.nodes[0], [run.ids[k] for k in positions], [run.sizes[k] for k in positions],
            [run.crcs[k] for k in positions], run.grant)

    def _renew(self, run: Run) -> bool:
        """Replace the run's grant by a fresh one for the items still leased to the batch."""
        try:
            run.grant, lost = self.client.leases.regrant(run.ids, run.leases)
        except ClusterError as exc:
            log.warning("could not renew a read grant: %s", exc)
            return False
        if lost:
            log.warning("%d items of this batch are no longer leased to it (another consumer "
                        "has them now), e.g. %s", len(lost), lost[:5])
            self.lost.update(lost)
        return True

    def _with_failover(self, run: Run, positions: list[int]) -> dict[int, bytes]:
        """The client's read of these items (replicas in turn, bad copies reported); items no
        replica serves are given back to the queue."""
        got, failed = self.client.fetch([run.item(k) for k in positions])
        if failed:
            log.warning("no replica could serve %d items; giving them back", len(failed))
            try:  # if this fails, the task fails and the batch is not acked: nothing lost
                self.client.nack_many(failed, delay_s=UNREADABLE_DELAY_S,
                                      error="no replica could be read")
            except NOT_HELD:
                pass
        return got


def _chunks(sizes: list[int]) -> Iterator[tuple[int, int]]:
    """``(start, end)`` positions of chunks of at most FETCH_ITEMS items and about
    FETCH_BYTES bytes (a single item may be bigger)."""
    start, size = 0, 0
    for k, n in enumerate(sizes):
        if k > start and (k - start >= FETCH_ITEMS or size + n > FETCH_BYTES):
            yield start, k
            start, size = k, 0
        size += n
    if start < len(sizes):
        yield start, len(sizes)


def to_arrow(queue: str, run: Run, start: int, end: int,
             payloads: dict[int, bytes]) -> pa.RecordBatch:
    """Rows in ``SCHEMA`` for the items ``start:end`` of ``run`` whose payloads were read."""
    ids = run.ids[start:end]
    every = len(payloads) == len(ids)
    positions = [] if every else [k for k in range(start, end) if run.ids[k] in payloads]

    def pick(column: Any) -> Any:
        return column[start:end] if every else [column[k] for k in positions]

    if not every:
        ids = pick(run.ids)
    n = len(ids)
    micros = pc.multiply(pa.array(pick(run.enqueued_at), pa.float64()), 1_000_000)
    keys = pick(run.keys)
    key_column = pa.array([k or None for k in keys], pa.string()) if any(keys) \
        else pa.nulls(n, pa.string())
    return pa.RecordBatch.from_arrays([
        pa.array(ids, pa.int64()),
        pa.array([queue] * n, pa.string()),
        pa.array(pick(run.priorities), pa.int32()),
        pa.array(pick(run.attempts), pa.int32()),
        pc.round(micros).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        key_column,
        pa.array([payloads[i] for i in ids], pa.binary()),
    ], schema=ARROW_SCHEMA)
