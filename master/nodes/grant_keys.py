"""The master's capability keys: the ring it signs grants with, rotated without a restart.

The ring holds three keys: the previous one (grants it signed may still be in use), the
current one (signs every grant) and the next one. Every heartbeat reply hands a data node
its own keys derived from the whole ring (``capability.node_key``), so a node knows the next key a
full period before the master signs with it: a rotation never meets a node that has not heard of
the new key yet. Each ``capability_key_s`` the ring moves on by one (the previous key retires, a
new next key is drawn), so a key is valid for three periods and signs during the middle one; a
grant that outlives its key is refused like an expired one.

The ring is kept in the data directory (``capability_keys``, mode 0600, replaced atomically),
so a restarted master keeps honouring the grants it issued; with an in-memory WAL (tests) it
lives in memory only.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Callable

from blizzard.server.capability import Verified, check_put_grant, node_key, sign_get, sign_put
from blizzard.wire import protocol as p
from blizzard.wire.errors import Forbidden, UnknownItem

log = logging.getLogger(__name__)

FILE = "capability_keys"
KEY_BYTES = 32
# How long a get grant lasts. Clients read right after leasing (a Spark executor within its
# micro-batch), so minutes are plenty; shorter than the key period, so it outlives no key.
GET_GRANT_S = 300.0


class CapabilityKeys:
    """The key ring, its rotation, and the grants signed with it."""

    def __init__(self, directory: str | None, period_s: float, now: float,
                 sign: bool = True) -> None:
        """``sign`` False (security off): grants carry no MAC, as no data node checks one and
        signing costs HMACs on every lease and placement."""
        self.sign = sign
        self.path = os.path.join(directory, FILE) if directory is not None else None
        self.period_s = period_s
        self.ring: list[p.CapabilityKey] = []  # previous, current, next
        self.rotated_at = now  # unix time: a restart must not postpone rotation forever
        self.verified = Verified()  # put grants checked before: an enqueue's, once per block
        if self.path is not None and os.path.exists(self.path):
            self._load()
        else:
            self.ring = [p.CapabilityKey(key_id, secrets.token_bytes(KEY_BYTES))
                         for key_id in (1, 2, 3)]
            self._save()

    # -- the ring ----------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Rotate once the current key has signed for a period."""
        if now - self.rotated_at >= self.period_s:
            self.rotate(now)

    def rotate(self, now: float) -> None:
        """Retire the previous key, sign with the next one, draw a new next key.

        On disk first: if that fails (OSError), the ring stays as it was.
        """
        nxt = p.CapabilityKey(self.ring[-1].key_id + 1, secrets.token_bytes(KEY_BYTES))
        old_ring, old_at = self.ring, self.rotated_at
        self.ring, self.rotated_at = self.ring[1:] + [nxt], now
        try:
            self._save()
        except OSError:
            self.ring, self.rotated_at = old_ring, old_at
            raise
        log.info("capability key %d signs now; key %d retired", self.ring[1].key_id,
                 old_ring[0].key_id)

    def adopt(self, ring: list[p.CapabilityKey], rotated_at: float) -> None:
        """A standby takes its primary's ring (kept on disk), so that once promoted it
        honours the grants the primary issued."""
        if len(ring) == 3 and (ring != self.ring or rotated_at != self.rotated_at):
            self.ring, self.rotated_at = list(ring), rotated_at
            self._save()

    def keys(self) -> list[p.CapabilityKey]:
        """The whole ring (what a standby takes over)."""
        return self.ring

    def keys_for(self, node_id: str) -> list[p.CapabilityKey]:
        """The keys data node ``node_id`` checks grants with (its heartbeat replies): its own,
        derived from the ring, so it can sign no grant another node takes."""
        return [p.CapabilityKey(k.key_id, node_key(k.key, node_id)) for k in self.ring]

    # -- grants ------------------------------------------------------------------------------

    def put_grant(self, first: int, n: int, nodes: list[str], expiry: float) -> p.PutGrant:
        """A grant to put (or delete) ids ``first .. first + n - 1`` on ``nodes``."""
        current = self.ring[1]
        nodes = sorted(nodes)
        return p.PutGrant(first, n, nodes, current.key_id, expiry,
                          sign_put(current.key, current.key_id, expiry, first, n, nodes)
                          if self.sign else b"")

    def check_owned(self, grant: p.PutGrant | None, ids: list[int],
                    held: Callable[[int], bool] = lambda item_id: True) -> None:
        """Forbidden unless ``grant`` is a put grant this master signed covering ``ids``: the
        proof that whoever enqueues them was handed them. Its expiry is not checked: the
        master drops ids handed out and not enqueued in time on its own.

        Ids none of which this master holds (``held``) are ``UnknownItem`` instead: they were
        handed out by the master before a rebuild from the data nodes, under keys it lost, and
        the producer enqueues again under fresh ids as after any restart.
        """
        try:
            if grant is None:
                raise Forbidden("an enqueue needs the placement's grant for its ids")
            key = next((k.key for k in self.ring if k.key_id == grant.key_id), None)
            if key is None:
                raise Forbidden(f"capability key {grant.key_id} is unknown (retired?)")
            check_put_grant(key, grant, ids, self.verified)
        except Forbidden:
            if grant is None or any(map(held, ids)):
                raise
            raise UnknownItem(f"ids {ids[:3]}... were not handed out by this master (it was "
                              "rebuilt from the data nodes); the enqueue must be redone") from None

    def get_grant(self, ids: list[int], nodes: list[str], now: float,
                  until: float | None = None) -> p.GetGrant:
        """A grant to read ``ids`` from ``nodes`` for ``GET_GRANT_S``, or until ``until`` (the
        leases' end) if that is sooner."""
        current = self.ring[1]
        nodes = sorted(nodes)
        expiry = now + GET_GRANT_S if until is None else min(now + GET_GRANT_S, until)
        return p.GetGrant(ids, nodes, current.key_id, expiry,
                          sign_get(current.key, current.key_id, expiry, ids, nodes)
                          if self.sign else b"")

    # -- the file ----------------------------------------------------------------------------

    def _load(self) -> None:
        assert self.path is not None
        with open(self.path, "rb") as f:
            rotated_at, ring = p.loads(f.read())
        self.rotated_at = float(rotated_at)
        self.ring = [p.CapabilityKey(int(key_id), bytes(key)) for key_id, key in ring]

    def _save(self) -> None:
        """Write the ring to a new file (0600), fsync it, rename it over the old one."""
        if self.path is None:
            return
        tmp = self.path + ".tmp"
        body = p.dumps([self.rotated_at, [[k.key_id, k.key] for k in self.ring]])
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            os.fchmod(f.fileno(), 0o600)  # a stale tmp file may have had other modes
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, self.path)
        dir_fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
