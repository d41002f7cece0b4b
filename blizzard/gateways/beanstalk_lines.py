"""beanstalkd's text protocol, the lines (its ``doc/protocol.txt``): commands parsed and
checked, replies written. No I/O here: ``beanstalkd.py`` reads and writes the socket.

A command is one line of at most ``MAX_LINE`` bytes ending in CRLF: a name and its arguments,
separated by single spaces. ``put`` is followed by the job body and CRLF. Every error is one of
the protocol's own words (``BAD_FORMAT``, ``UNKNOWN_COMMAND``, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_LINE = 224  # bytes in a command line, CRLF included (beanstalkd's LINE_BUF_SIZE)
MAX_PRI = 2**32 - 1
MAX_SECONDS = 2**32 - 1
MAX_TUBE = 200  # bytes in a tube name
# beanstalkd's tube names: letters, digits and "-+/;.$_()", not starting with "-"; here they
# must also be Blizzard queue names (``check_queue_name``): letters, digits and "-_.:"
_TUBE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,199}")
_UINT = re.compile(r"[0-9]{1,20}")

# command -> its arguments' kinds: "u" an unsigned integer, "t" a tube name
SHAPES: dict[str, str] = {
    "put": "uuuu", "use": "t", "reserve": "", "reserve-with-timeout": "u", "reserve-job": "u",
    "delete": "u", "release": "uuu", "bury": "uu", "touch": "u", "watch": "t", "ignore": "t",
    "peek": "u", "peek-ready": "", "peek-delayed": "", "peek-buried": "", "kick": "u",
    "kick-job": "u", "stats-job": "u", "stats-tube": "t", "stats": "", "list-tubes": "",
    "list-tube-used": "", "list-tubes-watched": "", "pause-tube": "tu", "quit": "",
}


class LineError(Exception):
    """A command line the protocol refuses; ``word`` is the reply (``BAD_FORMAT``, ...)."""

    def __init__(self, word: str) -> None:
        super().__init__(word)
        self.word = word


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    args: tuple[int | str, ...]


def parse(line: bytes) -> Command:
    """One command line (without its CRLF), checked against its command's shape."""
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise LineError("BAD_FORMAT") from None
    parts = text.split(" ")
    name, raw = parts[0], parts[1:]
    shape = SHAPES.get(name)
    if shape is None:
        raise LineError("UNKNOWN_COMMAND")
    if len(raw) != len(shape):
        raise LineError("BAD_FORMAT")
    args: list[int | str] = []
    for kind, value in zip(shape, raw, strict=True):
        if kind == "t":
            if not _TUBE.fullmatch(value):
                raise LineError("BAD_FORMAT")
            args.append(value)
        else:
            if not _UINT.fullmatch(value) or int(value) > 2**64 - 1:
                raise LineError("BAD_FORMAT")
            args.append(int(value))
    return Command(name, tuple(args))


def line(*words: object) -> bytes:
    """A reply line: its words, space separated, and CRLF."""
    return " ".join(map(str, words)).encode("ascii") + b"\r\n"


def with_body(head: str, *args: object, body: bytes) -> bytes:
    """A reply that carries data: ``head args... <bytes>``, CRLF, the data, CRLF."""
    return line(head, *args, len(body)) + body + b"\r\n"


def yaml_list(names: list[str]) -> bytes:
    return ("---\n" + "".join(f"- {n}\n" for n in names)).encode()


def yaml_dict(fields: dict[str, object]) -> bytes:
    return ("---\n" + "".join(f"{k}: {v}\n" for k, v in fields.items())).encode()


def priority_of(pri: int) -> int:
    """beanstalkd's priority (0 most urgent .. 2**32-1) as Blizzard's (a signed 32-bit
    integer, lower first): the same order."""
    return pri - 2**31


def pri_of(priority: int) -> int:
    """Inverse of ``priority_of`` (an item enqueued by another client maps into range)."""
    return min(max(priority + 2**31, 0), MAX_PRI)
