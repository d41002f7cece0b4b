"""The master's settings: one frozen dataclass with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass

from blizzard.net.defaults import DEFAULT_MASTER
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MAX_LEASE_S
from blizzard.wire.protocol import MAX_ITEM_BYTES
from blizzard.wire.queue_settings import NAMES
from blizzard.wire.shard_messages import MAX_SHARDS

MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class MasterConfig:
    """Everything the master can be told; ``validate()`` refuses nonsense before startup."""

    data_dir: str
    bind: str = DEFAULT_MASTER
    replication: int = 2  # copies of each item (R)
    # W: copies that must be durable before an enqueue is acked; None (the default): R, resolved
    # on construction, so ``min_replicas`` is always a number to whoever reads a config
    min_replicas: int | None = None
    heartbeat_s: float = 1.0  # data nodes are told to heartbeat this often
    dead_after_s: float = 5.0  # a node silent this long is dead
    # ... and this long, suspect: placed only if need be, read from last (None: the shorter of
    # 2.5 heartbeats and half of dead_after_s)
    suspect_after_s: float | None = None
    sync_hold_ms: float = 1.0  # group commit across callers (``blizzard/server/sync_hold.py``)
    pending_timeout_s: float = 30.0  # ids handed out, or items staged, past this are dropped
    max_item_bytes: int = 8 * MiB
    max_lease_s: float = MAX_LEASE_S
    id_block: int = 100_000  # ids reserved per WAL record, so most places need no fsync
    segment_bytes: int = 64 * MiB
    checkpoint_records: int = 500_000  # WAL records between checkpoints
    keep_wal: bool = False  # never remove WAL segments a checkpoint covers (audits, chaos)
    keys: str | None = None  # key directory (``blizzard keys generate``); None: insecure
    capability_key_s: float = 600.0  # the capability signing key is replaced this often
    metrics_port: int | None = None  # Prometheus /metrics on metrics_addr:port; None: off
    metrics_addr: str = "127.0.0.1"
    metrics_allow_hosts: tuple[str, ...] = ()  # Host names /metrics answers to, besides its own
    metrics_queues: int = 100  # queues /metrics names, by name; the rest summed as "(other)"
    # high availability (master/ha/standby.py, master/ha/wal_shipping.py)
    standby_of: str | None = None  # follow this primary as a hot standby
    advertise: str | None = None  # the address others reach this master at; default: bind
    sync_standby: bool = True  # once a standby caught up, answer only what it holds too
    # a standby in sync promotes itself after this much silence; 0: never
    failover_after_s: float = 2.0
    # sharding (master/shard/heads.py)
    shard: int = 0  # this master's shard: its ids start at shard << 56
    shards: str = ""  # every shard's masters, space-separated, told to clients (Welcome)
    heads_bind: str | None = None  # publish queue heads on an XPUB socket here; None: off
    # who may create queues (master/rules/queue_policy.py)
    max_queues: int = 10_000  # queues the master holds at most; admin keys may fill it
    client_queues: int = 1_000  # a client key creates a queue only while fewer than this exist
    # a client key may set these when it creates a queue (space-separated; "all", or "" for
    # none); the rest (a dead-letter queue elsewhere, a rate limit) need an admin key
    client_settings: str = "lease_s max_attempts backoff_base_s backoff_cap_s attributes"

    @property
    def addr(self) -> str:
        return self.advertise or self.bind

    @property
    def quorum(self) -> int:
        """W as a number (its type says so): ``min_replicas``, which construction resolved."""
        return self.replication if self.min_replicas is None else self.min_replicas

    def __post_init__(self) -> None:
        if self.min_replicas is None:
            object.__setattr__(self, "min_replicas", self.replication)
        if self.suspect_after_s is None:
            object.__setattr__(self, "suspect_after_s",
                               min(2.5 * self.heartbeat_s, self.dead_after_s / 2))

    def validate(self) -> MasterConfig:
        if self.replication < 1:
            raise InvalidArgument("replication must be at least 1")
        if not 1 <= self.quorum <= self.replication:
            raise InvalidArgument("min-replicas must be between 1 and the replication factor")
        if self.heartbeat_s <= 0 or self.dead_after_s <= self.heartbeat_s:
            raise InvalidArgument("need 0 < heartbeat-s < dead-after-s")
        suspect_after_s = self.suspect_after_s  # a number: construction resolved it
        if suspect_after_s is None or \
                not self.heartbeat_s <= suspect_after_s <= self.dead_after_s:
            raise InvalidArgument("need heartbeat-s <= suspect-after-s <= dead-after-s")
        if not 0 <= self.sync_hold_ms <= 100:
            raise ValueError("sync_hold_ms must be in [0, 100]")
        if self.pending_timeout_s <= 0:
            raise InvalidArgument("pending-timeout-s must be positive")
        if self.capability_key_s <= self.heartbeat_s:  # nodes must hear of a key before it signs
            raise InvalidArgument("capability-key-s must be longer than heartbeat-s")
        if self.failover_after_s < 0:
            raise InvalidArgument("failover-after-s must be 0 (never) or positive")
        if not 0 <= self.shard < MAX_SHARDS:
            raise InvalidArgument(f"shard must be between 0 and {MAX_SHARDS - 1}")
        if not 1 <= self.client_queues <= self.max_queues:
            raise InvalidArgument("need 1 <= client-queues <= max-queues")
        unknown = set(self.client_settings.split()) - set(NAMES) - {"all"}
        if unknown:
            raise InvalidArgument(f"client-settings: no setting {sorted(unknown)[0]!r}; "
                                  f"settings: {', '.join(NAMES)} (or all)")
        if not 0 < self.max_item_bytes <= MAX_ITEM_BYTES:
            raise InvalidArgument(f"max-item-bytes must be between 1 and {MAX_ITEM_BYTES}")
        return self
