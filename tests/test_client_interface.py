"""One client interface: ``Client`` and ``ShardedClient`` both implement ``BlizzardClient``
(``blizzard/client/api.py``), and ``connect`` says which one a master list gives."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import blizzard
from blizzard.client.api import BlizzardClient, Producing, Staging, UnawaitedAcks, connect
from blizzard.client.core import Client
from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.client.leases import Leases
from blizzard.client.message import LeasedItem, Message
from blizzard.client.producer import Producer, Stager
from blizzard.client.sharded.client import ShardedClient
from blizzard.client.sharded.writes import ShardedProducer, ShardedStager, ShardLeases
from blizzard.wire.errors import DataCorrupt, InvalidArgument

# Public methods one class has and the interface does not, each on purpose.
EXTRA: dict[type, dict[str, str]] = {
    Client: {
        "discover": "a constructor: asks one master for its shards and makes the client of all "
                    "of them (a Client or a ShardedClient); not something a client does",
    },
    ShardedClient: {
        "open": "a constructor, the one connect and Client(list) use: refuses a list naming "
                "a master and its own standby as two shards",
        "refuse_standbys": "that check itself, which only a list of shards can fail",
        "shard_for": "which shard a key's items go to: there is no such question with one shard",
        "statuses": "each shard's status apart (status merges them): one cluster has one",
    },
}

# Methods whose return annotation differs from the interface's, each on purpose: the
# interface names a protocol (checked below), the class its own type.
OWN_RETURN = {
    "__enter__": "each returns itself",
    "producer": "Producer / ShardedProducer, both Producing",
    "stager": "Stager / ShardedStager, both Staging",
}

# The objects those methods return (and ``leases``), and the protocols they must meet.
PARTS = [(Producing, Producer), (Producing, ShardedProducer), (Staging, Stager),
         (Staging, ShardedStager), (UnawaitedAcks, Leases), (UnawaitedAcks, ShardLeases)]


def public_methods(cls: type) -> set[str]:
    return {name for name, value in inspect.getmembers(cls)
            if not name.startswith("_") and callable(value)}


def interface_methods(proto: type) -> set[str]:
    return {name for name in proto.__dict__ if callable(getattr(proto, name))
            and (not name.startswith("_") or name in ("__enter__", "__exit__"))
            and name not in ("_is_protocol", "_is_runtime_protocol")}


def parameters(fn: Any) -> list[tuple[str, Any, Any, Any]]:
    """(name, kind, default, annotation) of each parameter (the annotations are strings)."""
    return [(q.name, q.kind, q.default, q.annotation)
            for q in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("cls", [Client, ShardedClient], ids=lambda c: c.__name__)
def test_public_methods_are_the_interface_and_the_listed_extras(cls: type) -> None:
    assert public_methods(cls) - interface_methods(BlizzardClient) == set(EXTRA[cls])
    missing = {m for m in interface_methods(BlizzardClient) if not hasattr(cls, m)}
    assert not missing, f"{cls.__name__} lacks {sorted(missing)}"


@pytest.mark.parametrize("cls", [Client, ShardedClient], ids=lambda c: c.__name__)
def test_each_method_takes_the_interfaces_parameters(cls: type) -> None:
    for name in sorted(interface_methods(BlizzardClient)):
        want, got = getattr(BlizzardClient, name), getattr(cls, name)
        assert parameters(got) == parameters(want), f"{cls.__name__}.{name}"
        if name not in OWN_RETURN:
            assert inspect.signature(got).return_annotation == \
                inspect.signature(want).return_annotation, f"{cls.__name__}.{name} returns"


@pytest.mark.parametrize("proto, cls", PARTS, ids=lambda c: c.__name__)
def test_what_the_clients_hand_out_meets_its_protocol(proto: type, cls: type) -> None:
    for name in interface_methods(proto):
        assert parameters(getattr(cls, name)) == parameters(getattr(proto, name)), \
            f"{cls.__name__}.{name}"


def test_the_two_clients_differ_only_where_listed() -> None:
    """Their public surfaces side by side: every difference is in EXTRA."""
    only_client = public_methods(Client) - public_methods(ShardedClient)
    only_sharded = public_methods(ShardedClient) - public_methods(Client)
    assert only_client == set(EXTRA[Client])
    assert only_sharded == set(EXTRA[ShardedClient])


def test_connect_gives_a_client_for_one_shard_and_a_sharded_client_for_several() -> None:
    # nothing listens on these ports: making a client sends nothing but the sharded
    # client's Hello, which goes unanswered (checked again at first use)
    with connect("tcp://127.0.0.1:9,tcp://127.0.0.1:10", timeout_s=1) as one:
        assert type(one) is Client
        assert isinstance(one, BlizzardClient)
    with connect(["tcp://127.0.0.1:9", "tcp://127.0.0.1:11"], timeout_s=1) as two:
        assert type(two) is ShardedClient
        assert isinstance(two, BlizzardClient)
        assert len(two.shards) == 2
    assert blizzard.connect is connect and "connect" in blizzard.__all__


def test_connect_refuses_one_master_listed_as_two_shards() -> None:
    with pytest.raises(InvalidArgument, match="a master serves one shard"):
        connect(["tcp://127.0.0.1:9", "tcp://127.0.0.1:9,tcp://127.0.0.1:10"])


def test_client_of_a_list_is_still_a_sharded_client() -> None:
    """``Client(...)`` keeps working as before ``connect``."""
    with Client("tcp://127.0.0.1:9 tcp://127.0.0.1:11", timeout_s=1) as two:
        assert type(two) is ShardedClient


class FakeShard:
    """A shard's client whose reads of the ids in ``unreadable`` fail as ``Client.deliver``'s
    do when no item of its part could be read."""

    def __init__(self, master: str, unreadable: frozenset[int] = frozenset(), **_: Any) -> None:
        self.ctx, self.timeout_s, self.keys, self.unreadable = None, 1.0, None, unreadable

    def deliver(self, queue: str, items: list[LeasedItem]) -> list[Message]:
        got = [i for i in items if i.id not in self.unreadable]
        if not got:
            raise DataCorrupt(f"items {[i.id for i in items]}")
        return [Message(i.id, b"", queue, 0, 0, 0.0, i.lease, None) for i in got]  # type: ignore

    def close(self) -> None:
        pass


def leased(item_id: int) -> LeasedItem:
    return LeasedItem(item_id, 1, 0, 0, 0, 0, 0.0, [])


def test_a_sharded_deliver_reads_each_item_on_its_shard_in_the_items_order():
    one, two = 1 << 56, 2 << 56  # ids of shards 1 and 2
    sharded = ShardedClient(["a", "b", "c"], FakeShard, heads=False, unreadable=frozenset({two}))
    items = [leased(two + 1), leased(one), leased(3), leased(two)]
    # shard 2 served item two + 1; its item two is given back by that shard's deliver
    assert [m.id for m in sharded.deliver("q", items)] == [two + 1, one, 3]
    # a batch no item of which could be read fails as Client.deliver does
    with pytest.raises(DataCorrupt):
        sharded.deliver("q", [leased(two)])


def test_an_enqueues_options_are_the_ones_enqueue_options_checks() -> None:
    """``BlizzardClient.enqueue`` (so both clients) and ``EnqueueOptions.make``, which checks
    the options before anything is sent, take the same options with the same defaults; and
    ``enqueue_many``'s are some of them, with the same defaults."""
    def options(fn: Any) -> dict[str, Any]:
        return {q.name: q.default for q in inspect.signature(fn).parameters.values()
                if q.name not in ("self", "cls", "queue", "data", "items")}

    assert options(BlizzardClient.enqueue) == options(EnqueueOptions.make)
    many = options(BlizzardClient.enqueue_many)
    assert many.items() <= options(BlizzardClient.enqueue).items()
