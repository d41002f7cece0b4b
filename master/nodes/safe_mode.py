"""Safe mode after a start (as HDFS's): nothing is re-replicated or deleted until nodes report.

Until data nodes have had time to heartbeat after a master start, a node that has not
reported yet is not dead: planning copies or deleting blobs on what the master sees then
would act on a partial picture.
"""

from __future__ import annotations

import logging

from master.nodes.membership import Membership
from master.state.machine import State

log = logging.getLogger(__name__)


class SafeMode:
    """On from the start until every known node has reported, or ``dead_after_s`` has passed."""

    def __init__(self, until: float) -> None:
        self.until = until  # monotonic; 0: off

    @property
    def on(self) -> bool:
        return self.until > 0

    def leave_now(self, state: State, membership: Membership, mono: float) -> bool:
        """True once, at the moment safe mode ends."""
        if not self.on:
            return False
        reported = bool(state.node_addrs) and set(state.node_addrs) <= set(membership.nodes)
        if mono < self.until and not reported:
            return False
        log.info("leaving safe mode with %d live data nodes", len(membership.alive(mono)))
        self.until = 0.0
        return True
