"""The client interface: what ``Client`` (one cluster) and ``ShardedClient`` (several shards'
masters) both are, and ``connect``, which says which of the two one gets.

``BlizzardClient`` is a ``typing.Protocol``: the worker, the dispatcher and Spark take one and
work the same over one cluster or over shards. ``tests/test_client_interface.py`` checks that
both classes have every method here with the same parameters, and lists where they differ on
purpose.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from blizzard.client.consumer import Consumer
from blizzard.client.core import Client
from blizzard.client.jobs import JobStatus
from blizzard.client.message import LeasedItem, Message
from blizzard.client.pipeline import Staged
from blizzard.client.schedules import ScheduleStatus
from blizzard.client.sharded.client import ShardedClient, split_shards
from blizzard.net.defaults import DEFAULT_MASTER
from blizzard.wire import protocol as p

__all__ = ["BlizzardClient", "Producing", "Staging", "UnawaitedAcks", "connect"]


class Producing(Protocol):
    """A pipelining producer (``Client.producer``): ``send`` batches, ``flush`` for their ids."""

    def send(self, items: Iterable[bytes]) -> None: ...

    def flush(self) -> list[int]: ...


class Staging(Protocol):
    """A pipelining ``stage`` (``Client.stager``): ``flush`` gives what ``commit`` takes."""

    def send(self, items: Iterable[bytes], *, priority: int = 0, delay_s: float = 0.0,
             key: str | None = None) -> None: ...

    def flush(self) -> Staged: ...


class UnawaitedAcks(Protocol):
    """``client.leases`` as a worker uses it: acks sent without a reply, then waited for."""

    def ack_unawaited(self, msgs: Sequence[Any]) -> None: ...

    def flush(self, timeout_s: float) -> None: ...


@runtime_checkable
class BlizzardClient(Protocol):
    """A Blizzard client, of one cluster or of several shards (the methods' texts are
    ``Client``'s). Not thread-safe: one per thread."""

    timeout_s: float  # how long one call may take, retries included

    @property  # read-only here, so each client may hold its own kind
    def leases(self) -> UnawaitedAcks: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> None: ...

    def close(self) -> None: ...

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue(self, queue: str, data: bytes, *, priority: int = 0, delay_s: float = 0.0,
                not_before: Any = None, key: str | None = None, coalesce: bool = False,
                unique_key: str | None = None, unique_for_s: float | None = None,
                unique_until_done: bool = False, create: bool = True,
                lease_s: float | None = None, depends_on: Iterable[int] = (),
                on_dependency_failure: str = "cancel") -> int: ...

    def enqueue_many(self, queue: str, items: Iterable[bytes], *, priority: int = 0,
                     delay_s: float = 0.0, not_before: Any = None, key: str | None = None,
                     coalesce: bool = False) -> list[int]: ...

    def enqueue_task(self, queue: str, *, url: str, method: str = "POST",
                     headers: dict[str, str] | None = None, body: bytes | str = b"",
                     max_attempts: int = 5, backoff_s: float = 2.0, timeout_s: float = 10.0,
                     priority: int = 0, delay_s: float = 0.0, key: str | None = None) -> int: ...

    def producer(self, queue: str, *, window: int = 4, **options: Any) -> Producing: ...

    def stage(self, queue: str, items: Iterable[bytes], *, priority: int = 0,
              delay_s: float = 0.0, key: str | None = None) -> Staged: ...

    def stager(self, queue: str, *, window: int = 8, chunk_items: int = 1000) -> Staging: ...

    def commit(self, staged: Staged) -> None: ...

    # -- dequeue -----------------------------------------------------------------------------

    def dequeue(self, queue: str, *, lease_s: float | None = None,
                wait_s: float = 0.0) -> Message | None: ...

    def dequeue_many(self, queue: str, n: int, *, lease_s: float | None = None,
                     wait_s: float = 0.0, ack: Sequence[Message] = ()) -> list[Message]: ...

    def deliver(self, queue: str, items: list[LeasedItem]) -> list[Message]: ...

    def lease(self, queue: str, n: int, *, lease_s: float | None = None, wait_s: float = 0.0,
              ack: Sequence[Any] = ()) -> list[LeasedItem]: ...

    def lease_columns(self, queue: str, n: int, *, lease_s: float | None = None,
                      wait_s: float = 0.0) -> p.Leased: ...

    def fetch(self, items: list[LeasedItem]) -> tuple[dict[int, bytes], list[LeasedItem]]: ...

    def peek(self, queue: str, n: int = 1) -> list[Message]: ...

    def consume(self, queue: str, n: int = 100, *, lease_s: float | None = None,
                wait_s: float = 1.0) -> Consumer: ...

    def extend_many(self, msgs: Sequence[Any], *, lease_s: float,
                    progress: Mapping[int, tuple[float, str, bytes]] | None = None
                    ) -> list[int]: ...

    def ack_many(self, msgs: Sequence[Any]) -> None: ...

    def nack_many(self, msgs: Sequence[Any], *, delay_s: float | None = None,
                  error: str = "") -> None: ...

    def ack_ids(self, ids: Sequence[int], leases: Sequence[int], queue: str = "") -> None: ...

    def extend_ids(self, ids: Sequence[int], leases: Sequence[int], *,
                   lease_s: float) -> None: ...

    def nack_ids(self, ids: Sequence[int], leases: Sequence[int], *,
                 delay_s: float | None = None, error: str = "") -> None: ...

    def suspected(self) -> list[str]: ...

    # -- jobs --------------------------------------------------------------------------------

    def jobs(self, ids: Sequence[int], *, wait_s: float = 0.0,
             read: bool = True) -> list[JobStatus]: ...

    def cancel(self, ids: Iterable[int]) -> list[int]: ...

    def store_results(self, queue: str, jobs: Sequence[Any], blobs: Sequence[bytes], *,
                      kind: int = 0, ttl_s: float = 86400.0) -> list[int]: ...

    def schedule(self, name: str, queue: str, payload: bytes, *, cron: str = "",
                 every_s: float = 0.0, timezone: str = "UTC", catch_up: bool = True,
                 overlap: bool = False) -> ScheduleStatus: ...

    def schedules(self, names: Sequence[str] = ()) -> list[ScheduleStatus]: ...

    def remove_schedule(self, name: str) -> bool: ...

    # -- queues and the cluster --------------------------------------------------------------

    def stats(self, queue: str) -> dict[str, Any]: ...

    def queue_config(self, queue: str) -> dict[str, Any]: ...

    def create_queue(self, queue: str, **options: Any) -> dict[str, Any]: ...

    def configure_queue(self, queue: str, **options: Any) -> dict[str, Any]: ...

    def queues(self) -> list[dict[str, Any]]: ...

    def purge(self, queue: str) -> int: ...

    def redrive(self, queue: str, n: int = 10_000) -> int: ...

    def status(self) -> p.ClusterStatus: ...

    def delete(self, queue: str, item_id: int, *, force: bool = False) -> None: ...

    def delete_queue(self, queue: str, *, force: bool = False) -> int: ...

    def remove_node(self, node_id: str) -> int: ...


def connect(masters: str | Sequence[str] | None = None, **options: Any) -> BlizzardClient:
    """A client of the queue whose masters are ``masters`` (default ``tcp://127.0.0.1:5555``).

    One shard (an address, or a primary and its standbys as one string with commas between:
    ``"tcp://a:5555,tcp://b:5555"``): a ``Client``. Several shards (a list, or addresses
    separated by spaces, each shard's master started with ``--shard K``, listed in shard
    order): a ``ShardedClient`` over them; a list naming a master and its own standby as two
    shards raises ``InvalidArgument`` saying how to write them as one. ``options`` are
    ``Client``'s (``timeout_s``, ``keys``, ``admin``, ...). Both kinds are ``BlizzardClient``s.

    ``Client(masters, ...)`` does the same (it returns a ``ShardedClient`` for several shards)
    and stays for existing code; ``connect`` says in its type what one gets.
    """
    shards = split_shards(DEFAULT_MASTER if masters is None else masters)
    if len(shards) == 1:
        return Client(masters, **options)
    return ShardedClient.open(shards, Client, **options)
