"""A server's requests in one table: which op each handler serves, which roles may send it, what
it logs; the dispatch table and the allow-list are both made from it.

A server declares one ``Route`` per request type it serves, in one ``Routes``, in one place a
reader finds. ``Routes`` refuses an op declared twice and a route no role may call, binds each
route's handler (an attribute path on the server, ``"leases.ack"``) into the dispatch table, and
derives from the routes which ops each role may send (``allowed``). A role is the one a
connection's CURVE key authenticated with (``RouterServer.role_of``): ``node``, ``client``,
``admin``, or ``master`` (a standby following its primary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter
from typing import Any

NODE, CLIENT, ADMIN, STANDBY = "node", "client", "admin", "master"
ROLES = (NODE, CLIENT, ADMIN, STANDBY)


@dataclasses.dataclass(frozen=True)
class Route:
    """One request type: its handler, the roles whose keys may send it, the records it logs."""

    op: type  # the request's message class
    serve: str  # the handler: an attribute path on the server ("leases.ack")
    roles: tuple[str, ...]  # the roles that may send it (with security on)
    logs: tuple[type, ...] = ()  # the records it may write (the master's: to its WAL)


class Routes:
    """A server's routes by op, checked once: each op once, each with known roles."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.by_op: dict[type, Route] = {}
        for route in routes:
            if route.op in self.by_op:
                raise ValueError(f"{route.op.__name__} is routed twice")
            unknown = set(route.roles) - set(ROLES)
            if not route.roles or unknown:
                raise ValueError(f"{route.op.__name__} needs roles among {ROLES}, "
                                 f"not {route.roles}")
            self.by_op[route.op] = route
        # who may send what: made from the routes, never written apart from them
        self.allowed: dict[str, frozenset[type]] = {
            role: frozenset(op for op, r in self.by_op.items() if role in r.roles)
            for role in ROLES}

    def __iter__(self) -> Iterator[Route]:
        return iter(self.by_op.values())

    def only(self, *roles: str) -> frozenset[type]:
        """The ops that only keys of ``roles`` may send (``only(NODE)``: the data nodes' own)."""
        return frozenset(op for op, r in self.by_op.items() if set(r.roles) <= set(roles))

    def bind(self, server: object) -> dict[type, Callable[..., Any]]:
        """The dispatch table: each op's handler, looked up on ``server`` now (a wrong path
        fails here, at start, not at the first request)."""
        return {op: attrgetter(route.serve)(server) for op, route in self.by_op.items()}
