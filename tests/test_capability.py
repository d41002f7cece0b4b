"""Grants as data nodes check them: what a forged, expired or replayed capability gets.

Grants come from the master's ``CapabilityKeys`` (in memory), are checked by a node's
``KeyRing`` holding the keys a heartbeat reply would carry; no sockets.
"""

from __future__ import annotations

import time

import pytest

from blizzard.server.capability import KeyRing
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, InvalidArgument, ProtocolError
from master.config import MasterConfig
from master.nodes.grant_keys import GET_GRANT_S, CapabilityKeys

NOW = 1_700_000_000.0


@pytest.fixture
def keys() -> CapabilityKeys:
    return CapabilityKeys(None, 600.0, NOW)


def ring_of(keys: CapabilityKeys, node_id: str = "dn-a") -> KeyRing:
    """Data node ``node_id``'s ring after a heartbeat reply from this master."""
    ring = KeyRing()
    ring.load(keys.keys_for(node_id))
    return ring


def test_a_put_grant_covers_its_ids_on_its_nodes(keys):
    grant = keys.put_grant(100, 10, ["dn-b", "dn-a"], NOW + 30)
    ring = ring_of(keys)
    ring.check_put(grant, [100, 105, 109], "dn-a", NOW)
    ring_of(keys, "dn-b").check_put(grant, [109], "dn-b", NOW + 29)
    assert grant.nodes == ["dn-a", "dn-b"]  # signed sorted


def test_a_get_grant_covers_its_ids_on_its_nodes(keys):
    grant = keys.get_grant([7, 3, 9], ["dn-a"], NOW)
    ring = ring_of(keys)
    ring.check_get(grant, [3, 9], "dn-a", NOW)
    ring.check_get(grant, [9, 9, 7], "dn-a", NOW + GET_GRANT_S - 1)


@pytest.mark.parametrize("change", [
    {"mac": b"\x00" * 16}, {"mac": b""}, {"first": 50}, {"n": 1000}, {"nodes": ["dn-a", "dn-c"]},
    {"expiry": NOW + 3600}, {"key_id": 3},
], ids=lambda c: next(iter(c)))
def test_a_forged_put_grant_is_refused(keys, change):
    grant = p.replace(keys.put_grant(100, 10, ["dn-a", "dn-b"], NOW + 30), **change)
    with pytest.raises(Forbidden):
        ring_of(keys).check_put(grant, [100], "dn-a", NOW)


@pytest.mark.parametrize("change", [
    {"mac": b"\xff" * 16}, {"ids": [1, 2, 3, 4]}, {"nodes": ["dn-a", "dn-b"]},
    {"expiry": NOW + 3600},
], ids=lambda c: next(iter(c)))
def test_a_forged_get_grant_is_refused(keys, change):
    grant = p.replace(keys.get_grant([1, 2, 3], ["dn-a"], NOW), **change)
    with pytest.raises(Forbidden):
        ring_of(keys).check_get(grant, [1], "dn-a", NOW)


def test_a_grant_signed_with_a_key_not_of_the_master_is_refused(keys):
    other = CapabilityKeys(None, 600.0, NOW)  # another master: same key ids, other keys
    with pytest.raises(Forbidden, match="signature"):
        ring_of(keys).check_put(other.put_grant(1, 1, ["dn-a"], NOW + 30), [1], "dn-a", NOW)


def test_an_expired_grant_is_refused(keys):
    ring = ring_of(keys)
    put = keys.put_grant(1, 5, ["dn-a"], NOW + 30)
    get = keys.get_grant([1], ["dn-a"], NOW)
    with pytest.raises(Forbidden, match="expired"):
        ring.check_put(put, [1], "dn-a", NOW + 30)
    with pytest.raises(Forbidden, match="expired"):
        ring.check_get(get, [1], "dn-a", NOW + GET_GRANT_S + 0.001)


def test_a_put_grant_replayed_as_a_get_grant_is_refused(keys):
    put = keys.put_grant(1, 3, ["dn-a"], NOW + 30)
    as_get = p.GetGrant([1, 2, 3], put.nodes, put.key_id, put.expiry, put.mac)
    with pytest.raises(Forbidden, match="signature"):
        ring_of(keys).check_get(as_get, [1], "dn-a", NOW)
    get = keys.get_grant([1, 2, 3], ["dn-a"], NOW)
    as_put = p.PutGrant(1, 3, get.nodes, get.key_id, get.expiry, get.mac)
    with pytest.raises(Forbidden, match="signature"):
        ring_of(keys).check_put(as_put, [1], "dn-a", NOW)
    # nor does the wire let one kind stand in for the other
    with pytest.raises(ProtocolError):
        p.decode(p.encode(1, p.Get([1], put)))


def test_a_grant_for_other_ids_is_refused(keys):
    ring = ring_of(keys)
    with pytest.raises(Forbidden, match="these ids"):
        ring.check_put(keys.put_grant(100, 10, ["dn-a"], NOW + 30), [100, 110], "dn-a", NOW)
    with pytest.raises(Forbidden, match="these ids"):
        ring.check_put(keys.put_grant(100, 10, ["dn-a"], NOW + 30), [99], "dn-a", NOW)
    with pytest.raises(Forbidden, match="these ids"):
        ring.check_get(keys.get_grant([1, 3], ["dn-a"], NOW), [1, 2], "dn-a", NOW)


def test_a_grant_for_another_node_is_refused(keys):
    ring = ring_of(keys)
    with pytest.raises(Forbidden, match="dn-c"):
        ring.check_put(keys.put_grant(1, 1, ["dn-a", "dn-b"], NOW + 30), [1], "dn-c", NOW)
    with pytest.raises(Forbidden, match="dn-c"):
        ring.check_get(keys.get_grant([1], ["dn-a"], NOW), [1], "dn-c", NOW)


def test_a_node_that_never_heard_from_the_master_refuses_every_grant(keys):
    with pytest.raises(Forbidden, match="unknown"):
        KeyRing().check_put(keys.put_grant(1, 1, ["dn-a"], NOW + 30), [1], "dn-a", NOW)


def test_the_previous_key_still_works_and_one_retired_two_rotations_ago_does_not(keys):
    old = keys.get_grant([1], ["dn-a"], NOW)
    keys.rotate(NOW + 600)
    previous = keys.get_grant([1], ["dn-a"], NOW + 600)
    assert previous.key_id == old.key_id + 1
    ring_of(keys).check_get(old, [1], "dn-a", NOW + 1)  # signed with the previous key
    keys.rotate(NOW + 1200)
    ring = ring_of(keys)
    ring.check_get(previous, [1], "dn-a", NOW + 601)
    with pytest.raises(Forbidden, match=f"key {old.key_id} is unknown"):
        ring.check_get(old, [1], "dn-a", NOW + 1)


def test_nodes_know_the_next_key_before_the_master_signs_with_it(keys):
    ring = ring_of(keys)  # a node whose last heartbeat reply came before the rotation
    keys.rotate(NOW + 600)
    ring.check_put(keys.put_grant(1, 1, ["dn-a"], NOW + 630), [1], "dn-a", NOW + 600)


def test_the_ring_rotates_each_period(keys):
    first = [k.key_id for k in keys.keys()]
    keys.tick(NOW + 599)
    assert [k.key_id for k in keys.keys()] == first
    keys.tick(NOW + 600)
    assert [k.key_id for k in keys.keys()] == [i + 1 for i in first]
    keys.tick(NOW + 1199)
    assert [k.key_id for k in keys.keys()] == [i + 1 for i in first]


def test_the_ring_survives_a_restart_in_a_private_file(tmp_path):
    keys = CapabilityKeys(str(tmp_path), 600.0, NOW)
    keys.rotate(NOW + 600)
    grant = keys.put_grant(1, 1, ["dn-a"], NOW + 630)
    assert (tmp_path / "capability_keys").stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("*.tmp"))
    again = CapabilityKeys(str(tmp_path), 600.0, time.time())
    assert again.keys() == keys.keys()
    ring_of(again).check_put(grant, [1], "dn-a", NOW + 601)
    again.tick(NOW + 1199)  # the period runs from the rotation before the restart
    assert again.keys() == keys.keys()
    again.tick(NOW + 1200)
    assert again.keys()[0] == keys.keys()[1]


def test_a_rotation_that_cannot_be_written_changes_nothing(tmp_path):
    keys = CapabilityKeys(str(tmp_path), 600.0, NOW)
    before = keys.keys()
    (tmp_path / "capability_keys.tmp").mkdir()  # the temp file cannot be opened
    with pytest.raises(OSError):
        keys.rotate(NOW + 600)
    assert keys.keys() == before and keys.rotated_at == NOW


def test_a_key_period_no_heartbeat_could_keep_up_with_is_refused():
    with pytest.raises(InvalidArgument, match="capability-key-s"):
        MasterConfig(data_dir="unused", heartbeat_s=1.0, capability_key_s=1.0).validate()


def test_security_off_grants_carry_no_mac():
    # No data node checks a grant without security: signing would cost HMACs for nothing
    keys = CapabilityKeys(None, 600.0, NOW, sign=False)
    assert keys.get_grant([1, 2], ["dn-a"], NOW).mac == b""
    assert keys.put_grant(1, 10, ["dn-a", "dn-b"], NOW + 30).mac == b""


def test_a_put_grant_shown_again_is_not_signed_again_but_checked_for_what_changed(keys,
                                                                                   monkeypatch):
    from blizzard.server import capability

    macs = []
    node_mac = capability.node_mac
    monkeypatch.setattr(capability, "node_mac", lambda *a: macs.append(a) or node_mac(*a))
    grant = keys.put_grant(100, 64, ["dn-a", "dn-b"], NOW + 30)
    ring = ring_of(keys)
    for item_id in range(100, 110):  # a producer's puts, one item each, under one grant
        ring.check_put(grant, [item_id], "dn-a", NOW)
    assert len(macs) == 1
    with pytest.raises(Forbidden, match="does not cover"):  # the ids: checked each time
        ring.check_put(grant, [164], "dn-a", NOW)
    with pytest.raises(Forbidden, match="expired"):  # the expiry too
        ring.check_put(grant, [100], "dn-a", NOW + 31)
    forged = p.replace(grant, mac=bytes(16) + grant.mac[16:])  # the same fields, another MAC
    with pytest.raises(Forbidden, match="does not verify"):
        ring.check_put(forged, [100], "dn-a", NOW)
    wider = p.replace(grant, n=1000)  # the genuine MAC on other fields
    with pytest.raises(Forbidden, match="does not verify"):
        ring.check_put(wider, [900], "dn-a", NOW)
    # a new ring (a heartbeat reply after a rotation): its keys check the grant afresh
    keys.rotate(NOW + 600)
    keys.rotate(NOW + 1200)  # the grant's key retired
    ring.load(keys.keys_for("dn-a"))
    with pytest.raises(Forbidden, match="unknown"):
        ring.check_put(grant, [100], "dn-a", NOW)


def test_the_master_checks_an_enqueues_grant_once_per_placement(keys, monkeypatch):
    from master.nodes import grant_keys as capabilities

    signed = []
    sign_put = capabilities.check_put_grant.__globals__["sign_put"]
    monkeypatch.setitem(capabilities.check_put_grant.__globals__, "sign_put",
                        lambda *a: signed.append(a) or sign_put(*a))
    grant = keys.put_grant(100, 64, ["dn-a", "dn-b"], NOW + 30)
    for item_id in range(100, 110):
        keys.check_owned(grant, [item_id])
    assert len(signed) == 1
    with pytest.raises(Forbidden):
        keys.check_owned(p.replace(grant, first=0, n=1000), [5])
    with pytest.raises(Forbidden):
        keys.check_owned(grant, [164])


def test_grants_remembered_as_verified_are_bounded():
    from blizzard.server.capability import Verified

    verified = Verified(size=3)
    grant = p.PutGrant(1, 1, ["dn-a"], 1, NOW, b"m" * 16)
    for first in range(10):
        verified.check(b"k" * 32, p.replace(grant, first=first), b"m" * 16, lambda: b"m" * 16)
    assert len(verified.seen) <= 3


def test_a_remembered_grant_is_refused_once_its_key_id_names_another_key(keys):
    # a master restarted without its key file, or a standby that adopted another ring, signs
    # with new keys under the same ids: what the old keys verified does not pass any more
    grant = keys.put_grant(100, 64, ["dn-a", "dn-b"], NOW + 30)
    ring = ring_of(keys)
    ring.check_put(grant, [100], "dn-a", NOW)
    keys.check_owned(grant, [100])
    other = CapabilityKeys(None, 600.0, NOW)
    assert [k.key_id for k in other.ring] == [k.key_id for k in keys.ring]
    ring.load(other.keys_for("dn-a"))
    with pytest.raises(Forbidden, match="does not verify"):
        ring.check_put(grant, [100], "dn-a", NOW)
    keys.adopt(other.ring, NOW)
    with pytest.raises(Forbidden, match="does not verify"):
        keys.check_owned(grant, [100])


def test_a_grant_that_failed_its_check_is_not_remembered(keys):
    grant = keys.put_grant(100, 64, ["dn-a", "dn-b"], NOW + 30)
    ring = ring_of(keys)
    for forged in (p.replace(grant, mac=bytes(32)),  # twice each: refused both times
                   p.replace(grant, mac=grant.mac[16:] + grant.mac[:16])):  # the slices swapped
        for _ in range(2):
            with pytest.raises(Forbidden, match="does not verify"):
                ring.check_put(forged, [100], "dn-a", NOW)
