"""Differential sessions: the same bytes sent to the real beanstalkd and to ``blizzard
beanstalkd``, their replies compared.

A session is a list of steps: a label, the bytes to send (a template: ``{1}`` is the id that
server gave the first job it named, ``{2}`` the second, ...) and how many replies they get. A
reply is its line and, where the line says one follows (``OK n``, ``RESERVED id n``, ``FOUND
id n``), its body. Before the two are compared, each server's replies are put in one shape:

- job ids become ``#1``, ``#2``, ... by their first appearance (each server numbers its own);
- a YAML body (``stats``, ``stats-tube``, ``stats-job``, the tube lists) is parsed, a dict
  compared field by field and the byte count on its ``OK`` line left out (the body decides
  it); the fields of ``VOLATILE`` must be on both sides, their values are not compared;
- ``list-tubes`` is compared as a set (beanstalkd lists its tubes in the order they came).

A difference is ``(session, step label, field)``, the field ``""`` for a whole reply. The
test holds the list of the differences it expects, each with its reason (docs/beanstalkd.md
has the same list): one found that is not on it fails, and so does one listed and not found.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BODY_REPLIES = (b"OK", b"RESERVED", b"FOUND")
# fields that differ by nature (the process, the machine, the clock): present, not compared
VOLATILE = {"pid", "version", "rusage-utime", "rusage-stime", "uptime", "id", "hostname",
            "os", "platform", "binlog-max-size", "age", "time-left", "binlog-oldest-index",
            "binlog-current-index"}
ID_FIELDS = {"id"}  # stats-job's job id (``stats``'s ``id`` is the server's: volatile there)


@dataclass
class Step:
    label: str
    send: str | bytes  # a template (str) or raw bytes
    replies: int = 1


@dataclass
class Conversation:
    """One connection to one server, and the ids it has named so far."""

    port: int
    ids: list[int] = field(default_factory=list)
    buf: bytes = b""

    def __post_init__(self) -> None:
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def close(self) -> None:
        self.sock.close()

    def send(self, step: Step) -> list[tuple[bytes, bytes | None]]:
        data = step.send if isinstance(step.send, bytes) else \
            step.send.format(*[None, *self.ids]).encode()
        self.sock.sendall(data)
        return [self._reply() for _ in range(step.replies)]

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            more = self.sock.recv(65536)
            if not more:
                raise ConnectionError("the server closed the connection")
            self.buf += more

    def _reply(self) -> tuple[bytes, bytes | None]:
        while b"\r\n" not in self.buf:
            more = self.sock.recv(65536)
            if not more:
                return b"<closed>", None
            self.buf += more
        head, _, self.buf = self.buf.partition(b"\r\n")
        words = head.split()
        for word in words[1:2]:  # RESERVED id n, FOUND id n, INSERTED id, BURIED id
            if words[0] in (b"RESERVED", b"FOUND", b"INSERTED", b"BURIED") and word.isdigit():
                self._saw(int(word))
        if words and words[0] in BODY_REPLIES and words[-1].isdigit() and len(words) >= 2:
            n = int(words[-1])
            self._fill(n + 2)
            body, self.buf = self.buf[:n], self.buf[n + 2:]
            return head, body
        return head, None

    def _saw(self, job: int) -> None:
        if job not in self.ids:
            self.ids.append(job)

    def shape(self, reply: tuple[bytes, bytes | None], label: str) -> Any:
        """The reply in the shape both servers' replies are compared in."""
        head, body = reply
        words = [self._id_word(w, k, head) for k, w in enumerate(head.decode().split())]
        if body is None:
            return " ".join(words)
        parsed = parse_yaml(body)
        if parsed is None:  # a job's body: compared as it is
            return " ".join(words), body
        if isinstance(parsed, dict):
            for key in ID_FIELDS & parsed.keys():
                if label.startswith("stats-job"):
                    parsed[key] = self._id_text(int(parsed[key]))
            return words[0], parsed
        return words[0], set(parsed) if label.startswith("list-tubes") else parsed

    def _id_word(self, word: str, k: int, head: bytes) -> str:
        if k == 1 and word.isdigit() and head.split()[0] in (b"RESERVED", b"FOUND",
                                                             b"INSERTED", b"BURIED"):
            return self._id_text(int(word))
        return word

    def _id_text(self, job: int) -> str:
        self._saw(job)
        return f"#{self.ids.index(job) + 1}"


_YAML_ITEM = re.compile(r"^- (.*)$")
_YAML_FIELD = re.compile(r"^([A-Za-z0-9_.-]+): (.*)$")


def parse_yaml(body: bytes) -> dict[str, str] | list[str] | None:
    """beanstalkd's YAML (a dict of scalars, or a list of them); None if ``body`` is not that."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return None
    lines = text.split("\n")
    if not lines or lines[0] != "---" or lines[-1] != "":
        return None
    rows = lines[1:-1]
    if rows and all(_YAML_ITEM.match(r) for r in rows):
        return [_YAML_ITEM.match(r).group(1) for r in rows]  # type: ignore[union-attr]
    if all(_YAML_FIELD.match(r) for r in rows):
        return {m.group(1): m.group(2).strip('"')
                for m in map(_YAML_FIELD.match, rows) if m is not None}
    return None


def differences(session: str, steps: list[Step], real_port: int, gateway_port: int,
                closed: Callable[[], None]) -> tuple[set[tuple[str, str, str]], list[str]]:
    """Run ``steps`` on one connection to each server, in lockstep; the differences found and
    a transcript (for the failure message). ``closed`` returns once the gateway has seen the
    connection close (beanstalkd sees it at once; a gateway's session, within its poll)."""
    real, ours = Conversation(real_port), Conversation(gateway_port)
    found: set[tuple[str, str, str]] = set()
    transcript: list[str] = []
    try:
        for step in steps:
            a = [real.shape(r, step.label) for r in real.send(step)]
            b = [ours.shape(r, step.label) for r in ours.send(step)]
            for x, y in zip(a, b, strict=True):
                for what in compare(x, y):
                    found.add((session, step.label, what))
                    transcript.append(f"{session} / {step.label} / {what or 'reply'}: "
                                      f"beanstalkd {_field(x, what)!r}, "
                                      f"blizzard {_field(y, what)!r}")
    finally:
        real.close()
        ours.close()
        closed()
    return found, transcript


def compare(x: Any, y: Any) -> list[str]:
    """The fields where two shaped replies differ (``""``: the replies as a whole)."""
    if isinstance(x, tuple) and isinstance(y, tuple) and isinstance(x[1], dict) \
            and isinstance(y[1], dict) and x[0] == y[0]:
        out = [k for k in x[1].keys() | y[1].keys()
               if k not in x[1] or k not in y[1] or (k not in VOLATILE and x[1][k] != y[1][k])]
        return sorted(out)
    return [] if x == y else [""]


def _field(shaped: Any, what: str) -> Any:
    if what and isinstance(shaped, tuple) and isinstance(shaped[1], dict):
        return shaped[1].get(what, "<missing>")
    return shaped
