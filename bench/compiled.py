"""Would a compiled core pay? The servers' hot modules built with mypyc, measured against the
pure Python they are built from, in one run.

The project's packages are copied to a scratch dir and ``COMPILED`` is built there with mypyc
(part of mypy, a test dependency); each round then runs the same measurement twice, once with
the compiled copy first on ``PYTHONPATH`` (its extension modules load before the ``.py``
beside them) and once with the pure checkout, the order swapped every round:

- ``bench.master_loop`` (the master's own CPU per item, in process: its handlers);
- with ``--workers P,C``, also ``bench.workers`` at R=2 (the whole cluster under load, its
  master and data nodes compiled or not).

    scripts/bench --compiled --rounds 3 --workers 8,8

Two modules of the master are left pure: mypyc cannot build ``master/state/records.py`` (a
``dataclass_transform`` decorator applied to a function) nor ``master/state/queue_config.py``
(a native dataclass extending the wire's ``Settings``). The messages (``blizzard/wire``) stay
pure too: msgspec already encodes them in C. Nothing here is shipped: the measurement decides
whether a compiled build would be worth shipping (docs/benchmarks.md records it).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import start
from bench.workers import parse_workers

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("blizzard", "master", "datanode", "bench")
LEFT_PURE = {"master/state/records.py", "master/state/queue_config.py"}
COMPILED = ("master/state/*.py", "master/produce/*.py", "master/consume/*.py",
            "master/nodes/*.py", "master/log/wal.py", "master/server.py",
            "blizzard/server/router.py", "blizzard/server/sync_hold.py",
            # the data node's store and server loop
            "datanode/store.py", "datanode/server.py", "datanode/reads.py", "datanode/serves.py",
            "datanode/replica_waits.py", "datanode/grants.py", "datanode/meta.py")


def modules() -> list[str]:
    """The files ``COMPILED`` names, relative to the project's root, less ``LEFT_PURE``."""
    found = sorted({str(Path(f).relative_to(ROOT)) for pattern in COMPILED
                    for f in glob.glob(str(ROOT / pattern))})
    return [f for f in found if f not in LEFT_PURE]


def build(scratch: str) -> str:
    """Copy the packages to ``scratch`` and build ``modules()`` there; the copy's root."""
    tree = os.path.join(scratch, "tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, os.path.join(tree, package),
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # setup.cfg's mypy settings name the files to check: mypyc gets none of them
    mypyc = [sys.executable, "-m", "mypyc", "--config-file=", "--ignore-missing-imports",
             *modules()]
    began = time.monotonic()
    done = subprocess.run(mypyc, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mypyc failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    built = glob.glob(os.path.join(tree, "**", "*.so"), recursive=True)
    print(f"[compiled] built {len(built)} extension modules in "
          f"{time.monotonic() - began:.0f} s", file=sys.stderr)
    check = subprocess.run([sys.executable, "-c", "import master.server as s; print(s.__file__)"],
                           cwd=tree, env=_env(tree), capture_output=True, text=True, check=True)
    if not check.stdout.strip().endswith(".so"):
        raise RuntimeError(f"the compiled master does not load: {check.stdout} {check.stderr}")
    return tree


def _env(tree: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = tree
    return env


def _lines(argv: list[str], tree: str | None) -> list[dict[str, Any]]:
    """Run ``python -m argv`` on the compiled copy (``tree``) or the pure checkout; its
    JSON lines."""
    done = subprocess.run([sys.executable, "-m", *argv], cwd=tree or ROOT, env=_env(tree),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench --compiled", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compiled", action="store_true", help="(selects this benchmark)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each compiled and pure")
    ap.add_argument("--items", type=int, default=20000, help="items of the master loop")
    ap.add_argument("--workers", type=parse_workers, default=None,
                    help="P,C: also the cluster under load at R=2 (e.g. 8,8)")
    ap.add_argument("--seconds", type=float, default=10.0, help="how long each load runs")
    args = ap.parse_args(argv)
    scratch = start("compiled")
    try:
        tree = build(scratch)
        rows: dict[str, list[dict[str, Any]]] = {"compiled": [], "pure": []}
        for r in range(args.rounds):
            order = ("compiled", "pure") if r % 2 == 0 else ("pure", "compiled")
            for build_name in order:
                where = tree if build_name == "compiled" else None
                row: dict[str, Any] = {"system": "blizzard", "op": "compiled",
                                       "build": build_name, "round": r + 1}
                loop = _lines(["bench.master_loop", "--master-loop", str(args.items)], where)
                row["master_loop_cpu_us_per_item"] = loop[-1]["master_cpu_us_per_item"]
                if args.workers is not None:
                    load = [line for line in _lines(
                        ["bench.workers", "--workers", f"{args.workers[0]},{args.workers[1]}",
                         "--seconds", str(args.seconds), "--security", "off", "--configs", "2"],
                        where) if line.get("op") == "workers"][-1]
                    cpu = load["cpu_us_per_acked_item"]
                    row.update(acked_per_s=load["acked_per_s"], cpu_us_per_acked_item={
                        k: round(cpu[k]) for k in ("master", "servers", "total")})
                print(json.dumps(row), flush=True)
                rows[build_name].append(row)
        _table(rows)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _table(rows: dict[str, list[dict[str, Any]]]) -> None:
    """Round by round, on stderr: the compiled build's figures against the pure one's."""
    print("| round | master loop µs/item, compiled / pure | 8+8 acked/s | 8+8 master µs/item |"
          " 8+8 total µs/item |", file=sys.stderr)
    print("|---|---|---|---|---|", file=sys.stderr)
    for c, q in zip(rows["compiled"], rows["pure"], strict=True):
        print(f"| {c['round']} | {_both(c, q, 'master_loop_cpu_us_per_item')} |"
              f" {_both(c, q, 'acked_per_s')} |"
              f" {_both(c, q, 'cpu_us_per_acked_item', 'master')} |"
              f" {_both(c, q, 'cpu_us_per_acked_item', 'total')} |", file=sys.stderr)


def _both(compiled: dict[str, Any], pure: dict[str, Any], key: str, sub: str | None = None) -> str:
    if key not in compiled:
        return ""
    a, b = compiled[key], pure[key]
    if sub is not None:
        a, b = a[sub], b[sub]
    return f"{a:,} / {b:,}"

if __name__ == "__main__":
    sys.exit(main())
