"""WAL records made by hand, for tests of the master's state machine."""

from __future__ import annotations

from collections.abc import Sequence

from master.state.records import CommitItems


def commit(ids: list[int], uniques: Sequence[str] = (), at: float = 100.0, until: float = 0.0,
           queue: str = "q", *, not_before: float = 0.0, result_of: Sequence[int] = (),
           kind: int = 0, depends_on: Sequence[int] = (), on_failure: int = 0) -> CommitItems:
    """A ``CommitItems`` of ``ids`` (size 1, no key, on ``dn-a``), with whatever of unique
    keys (taken until ``until``), a delay, results or dependencies is given."""
    n = len(ids)
    return CommitItems(queue=queue, ids=ids, sizes=[1] * n, crcs=[0] * n, priorities=[0] * n,
                       not_befores=[not_before] * n, keys=[""] * n, coalesce=False,
                       nodes=["dn-a"], at=at, request="", uniques=list(uniques),
                       unique_until=until, result_of=list(result_of), result_kind=kind,
                       depends_on=list(depends_on), on_dependency_failure=on_failure)
