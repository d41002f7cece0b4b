"""Who may create a queue, and with which settings: the quotas and the settings policy.

Every queue costs memory, WAL records and a row in each listing for as long as it exists, so
the master holds at most ``max_queues``. A client key creates one (``Configure`` with
``create``, or an enqueue to a new name) only while fewer than ``client_queues`` exist: a
flood from a client key stops there, and admin keys keep the rest as headroom to create,
list and delete. Servers know a connection by its key's role, not by which of the role's
keys it holds, so the client quota is shared by every client key.

A client key may set, when it creates a queue, only the settings named in
``client_settings`` (by default those that shape the queue's own retries, as ``@task``
names them); any other setting that differs from its default (a dead-letter queue
elsewhere, a rate limit) needs an admin key, as changing a queue always does. Without
security (``role`` None) every caller is treated as an admin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blizzard.wire.errors import Forbidden, TooManyQueues
from blizzard.wire.queue_settings import NAMES, Settings
from master.config import MasterConfig

_DEFAULTS = Settings()


class QueuePolicy:
    """The master's rules for new queues, checked before anything is logged."""

    def __init__(self, config: MasterConfig, state: Any,
                 role_of: Callable[[bytes], str | None]) -> None:
        self.max_queues = config.max_queues
        self.client_queues = config.client_queues
        names = config.client_settings.split()
        self.client_settings = frozenset(NAMES if "all" in names else names)
        self.state = state
        self.role_of = role_of

    def may_create(self, name: str, peer: bytes) -> None:
        """``TooManyQueues`` unless ``peer`` may bring queue ``name`` into existence."""
        queues = self.state.queues
        if name in queues:
            return
        n = len(queues)
        if n >= self.max_queues:
            raise TooManyQueues(f"the master holds {n} queues, its max-queues; delete unused "
                                "ones (`blizzard queue delete`, an admin key) or reuse one")
        if n >= self.client_queues and self.role_of(peer) == "client":
            raise TooManyQueues(f"the master holds {n} queues; a client key may create one "
                                f"only while fewer than {self.client_queues} exist (the "
                                "master's --client-queues): reuse a queue, or have an admin "
                                "create or delete some")

    def may_set(self, changes: Mapping[str, Any], peer: bytes) -> None:
        """``Forbidden`` unless ``peer`` may create a queue with these settings."""
        if self.role_of(peer) != "client":
            return
        beyond = sorted(name for name, value in changes.items()
                        if name not in self.client_settings and value != getattr(_DEFAULTS, name))
        if beyond:
            allowed = ", ".join(sorted(self.client_settings)) or "none"
            raise Forbidden(f"a client key may not create a queue with {', '.join(beyond)} set "
                            f"(it may set: {allowed}); use an admin key, or the master's "
                            "--client-settings")
