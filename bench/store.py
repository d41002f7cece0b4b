"""A data node's store alone, in this process: CPU per item of each of its calls.

``LevelDbStore`` (real LevelDB, real fsync, in a scratch dir) is handed what a data node does
with the copies of items at ``--batch`` per call: one synced ``put_many`` with their metadata,
a ``get_many`` (the lease's read), a ``delete_many`` (the ack's delete order). CPU time is the
process's (``time.process_time``: LevelDB's compaction thread counted too), per item, for each
call; a node's own CPU per item in ``--workers`` or the batched runs is this plus its messages.

    scripts/bench --store --batch 100 --items 100000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import zlib

from bench.common import start
from datanode.store import LevelDbStore


def run(scratch: str, items: int, batch: int, size: int) -> dict[str, float]:
    os.makedirs(scratch)
    store = LevelDbStore(os.path.join(scratch, "store"))
    blob = os.urandom(size)
    crc = zlib.crc32(blob)
    meta = os.urandom(40)  # an encoded ItemMeta is about this size (queue "q", no key)
    spent = {"put": 0.0, "get": 0.0, "delete": 0.0}
    began = time.perf_counter()
    try:
        for first in range(0, items, batch):
            ids = list(range(first, min(items, first + batch)))
            n = len(ids)
            cpu = time.process_time()
            store.put_many(ids, [blob] * n, [crc] * n, [meta] * n)
            spent["put"] += time.process_time() - cpu
            cpu = time.process_time()
            if any(found is None for found in store.get_many(ids)):
                raise RuntimeError("a stored blob was not found")
            spent["get"] += time.process_time() - cpu
            cpu = time.process_time()
            store.delete_many(ids)
            spent["delete"] += time.process_time() - cpu
        if store.count != 0:
            raise RuntimeError(f"{store.count} blobs left after their deletes")
    finally:
        store.close()
    wall = time.perf_counter() - began
    return {f"{call}_cpu_us_per_item": round(s / items * 1e6, 2) for call, s in spent.items()} | {
        "items_per_s": round(items / wall)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench --store", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", action="store_true", help="(selects this benchmark)")
    ap.add_argument("--items", type=int, default=100_000, help="items through the store")
    ap.add_argument("--batch", type=int, default=100, help="items per call")
    ap.add_argument("--size", type=int, default=256, help="payload bytes")
    ap.add_argument("--repeat", type=int, default=3, help="runs, each on a new store")
    args = ap.parse_args(argv)
    if args.items < 1 or args.batch < 1:
        ap.error("--items and --batch must be at least 1")
    scratch = start("store")
    try:
        for r in range(args.repeat):
            line = {"system": "blizzard", "op": "store", "run": r + 1, "items": args.items,
                    "batch": args.batch, "size": args.size}
            line |= run(os.path.join(scratch, str(r)), args.items, args.batch, args.size)
            print(json.dumps(line), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
