"""What to tell someone whose master is not there: where its address came from and how to
start a cluster, in one text worded for the command line or for Python."""

from __future__ import annotations

from blizzard.net.defaults import DEFAULT_MASTER

GIVEN = "given to Client()"
DEFAULT = f"Client()'s default, {DEFAULT_MASTER} (no address was given)"


def nothing_listens(addr: str) -> str:
    """The fact a refused connection shows."""
    return f"nothing listens at {addr} (the connection was refused)"


def start_hint(origin: str, *, cli: bool) -> str:
    """Where the address came from (``origin``: "given by --master", ``GIVEN``, ...) and how
    to start a cluster and point the command (``cli``) or the program at it."""
    point = ("point the command at it with --master or BLIZZARD_MASTER" if cli
             else 'pass its master\'s address: Client("tcp://HOST:PORT")')
    return (f"that address was {origin}. Is a master running? To start one: `blizzard cluster "
            "--data-dir DIR` (a master and data nodes on this machine; it prints the address "
            "and keys to use), or `blizzard master --data-dir DIR --keys DIR` and `blizzard "
            f"datanode ...` on several machines; then {point}")
