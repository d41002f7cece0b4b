"""``master --rebuild-from-datanodes``: a master that lost its data dir, rebuilt from its nodes.

With no standby and the master's disk gone, the items' metadata still sits on the data nodes,
beside each blob (``datanode/meta.py``). Before the new master serves, on an EMPTY data dir,
this pages through every listed node's metadata (``ListMeta``, ``PAGE_ITEMS`` at a time),
folds it into records (``master/ha/rebuild_fold.py``: the cluster id, the nodes, an id
high-water above anything any node ever held, the items with all their holders), logs them
to a fresh WAL, fsyncs, and writes a checkpoint. The master then starts on that data dir as
after any restart: safe mode, inventories, and re-replication back to R copies; until safe
mode ends it holds reads back (``hold_reads``).

Every node of the cluster should be listed: an item only an unlisted node holds is not
rebuilt (and that node's inventory then has its blob deleted). A node that does not answer
stops the rebuild, so nothing is rebuilt from part of the cluster by accident.

Security: the nodes take ``ListMeta`` from a data node or admin key; the master uses the
``admin`` pair of its key directory, else the ``datanode`` pair.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

import zmq

from blizzard.host.file_modes import private_dir
from blizzard.net import keys as k
from blizzard.net.addrs import check_addr
from blizzard.net.transport import Endpoint, call
from blizzard.wire import protocol as p
from blizzard.wire.errors import (
    AuthenticationFailed,
    DatanodeUnavailable,
    InvalidArgument,
    MasterStarting,
)
from master.config import MasterConfig
from master.ha.rebuild_fold import NodeScan, Rebuilt, check_node, fold
from master.log import checkpoint_file
from master.log.wal import Wal, fsync_dir
from master.state import records
from master.state.machine import State

log = logging.getLogger(__name__)

PAGE_ITEMS = 5_000  # items asked for per page (a node serves at most this many)
READS = (p.Lease, p.Regrant, p.Peek)  # requests answered with read grants
CALL_S = 10.0  # one page's wait
ATTEMPTS = 3  # tries per page before the node counts as unreachable


def parse_addrs(text: str) -> list[str]:
    """``tcp://A,tcp://B,...`` as a list of checked, distinct addresses."""
    addrs = list(dict.fromkeys(a.strip() for a in text.split(",") if a.strip()))
    if not addrs:
        raise InvalidArgument("--rebuild-from-datanodes needs the data nodes' addresses")
    return [check_addr(a) for a in addrs]


def refuse_used(data_dir: str) -> None:
    """``InvalidArgument`` unless ``data_dir`` holds no WAL or checkpoint: a rebuild never
    overwrites a master's state."""
    wal_dir = os.path.join(data_dir, "wal")
    if os.path.isdir(wal_dir) and os.listdir(wal_dir):
        raise InvalidArgument(f"{data_dir} already holds a master's WAL: a rebuild from the "
                              "data nodes starts on an empty data dir only (without "
                              "--rebuild-from-datanodes the master recovers from it)")


def node_keys(keys_dir: str | None) -> k.ClientKeys | None:
    """The pair the master asks the nodes with: ``admin``, else a data node's own."""
    if keys_dir is None:
        return None
    for name in ("admin", *(k.NODE_PREFIX + n for n in k.node_names(keys_dir))):
        if os.path.exists(os.path.join(keys_dir, name + ".key_secret")):
            public, secret = k.load_pair(keys_dir, name)
            return k.ClientKeys(public, secret, k.load_public(keys_dir, "master"),
                                k.load_public(keys_dir, "datanode"))
    raise AuthenticationFailed("a rebuild needs the admin (or a data node's) key pair in "
                               f"{keys_dir}")


def scan(ep: Endpoint, addr: str) -> NodeScan:
    """Every item one node holds, page by page (each page checked before it counts)."""
    result: NodeScan | None = None
    start = 0
    while True:
        page = _page(ep, addr, start)
        if result is None:
            result = check_node(page)
        result.take(page)
        if page.done:
            return result
        start = page.next


def _page(ep: Endpoint, addr: str, start: int) -> p.MetaPage:
    for attempt in range(ATTEMPTS):
        try:
            reply = call(ep, p.ListMeta(start, PAGE_ITEMS), CALL_S)
        except TimeoutError:
            log.warning("data node %s did not answer (attempt %d of %d)", addr, attempt + 1,
                        ATTEMPTS)
            ep.reset()
            continue
        if not isinstance(reply, p.MetaPage):
            raise InvalidArgument(f"data node {addr} answered ListMeta with {p.op_name(reply)}")
        return reply
    raise DatanodeUnavailable(f"data node {addr} did not answer: a rebuild needs every node "
                              "listed (start it, or leave it out of --rebuild-from-datanodes)")


def write(config: MasterConfig, rebuilt: Rebuilt) -> None:
    """The records in a new WAL (fsynced), then a checkpoint of the state they make; written
    aside and renamed into place, so a rebuild cut short leaves no WAL behind."""
    final = os.path.join(config.data_dir, "wal")
    aside = final + ".rebuilding"
    shutil.rmtree(aside, ignore_errors=True)  # an earlier rebuild's, cut short
    wal = Wal(aside, segment_bytes=config.segment_bytes)
    try:
        for _ in wal.replay():  # an empty log: this only opens its first segment
            pass
        state = State()
        for rec in rebuilt.records:
            wal.append(records.pack(rec))
            state.apply(rec)
        wal.flush()
        start = wal.roll()
        checkpoint_file.write(aside, start, state.export_parts())
        checkpoint_file.prune(aside, start)
    finally:
        wal.close()
    refuse_used(config.data_dir)
    os.rename(aside, final)
    fsync_dir(config.data_dir)


def hold_reads(server: Any) -> Any:
    """``server`` (the rebuilt master) answering reads with ``MasterStarting`` until every
    data node it knows has reported (safe mode ends); its clients wait that out.

    Its capability keys are new, and a node learns them only from its first heartbeat reply:
    a read grant signed before that would be refused by the node. (A master restarted on its
    own data dir keeps its keys, so this holds only after a rebuild.)
    """
    def held(handler: Callable[..., Any]) -> Callable[..., Any]:
        def hold(*args: Any) -> Any:
            if server.safe_mode.on:
                raise MasterStarting("the master was rebuilt from its data nodes and waits "
                                     "for them to report")
            return handler(*args)
        return hold
    for op in READS:
        server.handlers[op] = held(server.handlers[op])
    return server


def rebuild(config: MasterConfig, addrs: list[str], ctx: zmq.Context | None = None) -> Rebuilt:
    """Rebuild the master's state in ``config.data_dir`` from the nodes at ``addrs``."""
    refuse_used(config.data_dir)
    private_dir(config.data_dir)  # 0700: blizzard/host/file_modes.py
    started = time.monotonic()
    ctx = ctx or zmq.Context.instance()
    keys = node_keys(config.keys)
    scans: dict[str, NodeScan] = {}
    for addr in addrs:
        ep = Endpoint(ctx, addr, keys, keys.datanode if keys else None)
        try:
            found = scan(ep, addr)
        finally:
            ep.close()
        if found.node_id in scans:
            raise InvalidArgument(f"{addr} and {scans[found.node_id].addr} are the same data "
                                  f"node {found.node_id}")
        scans[found.node_id] = found
        log.info("data node %s at %s: %d items", found.node_id, addr, len(found.items))
    rebuilt = fold(list(scans.values()), time.time())
    write(config, rebuilt)
    log.info("rebuilt cluster %s from %d data nodes in %.1fs: %d items, ids from %d on",
             rebuilt.cluster_id, len(scans), time.monotonic() - started, rebuilt.items,
             rebuilt.id_hi)
    return rebuilt
