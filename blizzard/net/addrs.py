"""What a server address may be: ``tcp://host:port``, checked before ZeroMQ is given it."""

from __future__ import annotations

import re

from blizzard.wire.errors import InvalidArgument

_ADDR = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):([0-9]{1,5})")


def check_addr(addr: str) -> str:
    """``addr`` if it is a ``tcp://host:port`` address ZeroMQ can connect to, else
    InvalidArgument."""
    m = _ADDR.fullmatch(addr) if type(addr) is str else None
    if m is None or not 0 < int(m.group(2)) < 65536:
        shown = addr[:60] if type(addr) is str else type(addr).__name__
        raise InvalidArgument(f"{shown!r} is not a tcp://host:port address")
    return addr
