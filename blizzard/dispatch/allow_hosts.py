"""Which hosts ``blizzard dispatch`` may send requests to (``--allow-hosts``).

Anyone who may enqueue names the URL a task goes to, so a dispatcher with no list makes
requests to any host it can reach, internal services and cloud metadata addresses included
(server-side request forgery). A list closes that: a task whose host is not on it is
dead-lettered unsent.

Patterns are exact host names (``api.example.com``), IP addresses (``10.0.0.7``, ``::1``) or
suffix patterns (``*.example.com``: any name below ``example.com``, not ``example.com`` itself).
The host checked is the one aiohttp connects to (``yarl``'s ``raw_host``), so two URL parsers
cannot disagree about it. Names are matched as written, not resolved: a name on the list that
resolves to an internal address is allowed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from yarl import URL

from blizzard.wire.errors import InvalidArgument

_NAME = re.compile(r"^[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$")


@dataclass(frozen=True)
class HostPolicy:
    """The hosts allowed; no patterns at all: any host (the default)."""

    exact: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()  # ".example.com" for "*.example.com"

    @classmethod
    def parse(cls, patterns: Iterable[str]) -> HostPolicy:
        """A policy from patterns; ``InvalidArgument`` names the first one that is not valid."""
        exact: set[str] = set()
        suffixes: list[str] = []
        for pattern in patterns:
            if pattern.startswith("*."):
                suffixes.append("." + _checked_name(pattern[2:], pattern))
            else:
                exact.add(_ip(pattern) or _checked_name(pattern, pattern))
        return cls(frozenset(exact), tuple(suffixes))

    @property
    def open(self) -> bool:
        """True when every host is allowed."""
        return not self.exact and not self.suffixes

    def refusal(self, url: str) -> str:
        """Why a request to ``url`` may not be sent ("" if it may)."""
        if self.open:
            return ""
        try:
            raw = URL(url).raw_host or ""
        except ValueError:
            raw = ""
        host = _ip(raw) or _normal(raw)
        if host and (host in self.exact or host.endswith(self.suffixes)):
            return ""
        return f"host {host or '(none)'!r} is not in the dispatcher's --allow-hosts; not sent"


def _normal(name: str) -> str:
    return name.lower().removesuffix(".")


def _ip(text: str) -> str:
    """The canonical form of an IP address literal ("" if ``text`` is not one)."""
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        return ""


def _checked_name(name: str, pattern: str) -> str:
    name = _normal(name)
    if len(name) > 253 or not _NAME.match(name):
        raise InvalidArgument(f"allowed host {pattern!r} is not a host name, an IP address or "
                              "*.suffix")
    return name
