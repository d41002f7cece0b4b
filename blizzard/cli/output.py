"""How the ``blizzard`` command prints: ``--json`` documents, payloads, and figures with units.

``--json`` prints exactly one JSON document on stdout, with the keys listed in each command's
help. A payload appears as ``data_b64`` (base64 of the exact bytes) plus ``data``: the text
when the bytes are valid UTF-8, else null. Human output rounds figures and names their units
(``0.6 s``, ``12 MiB``); a payload in it is escaped so that one item is one line (``\\t``,
``\\n``, ``\\r``, ``\\\\`` and ``\\xNN`` for bytes that are not UTF-8).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import click

json_opt = click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document (keys listed above) instead of text.")

_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}


def echo_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=False))


def payload(data: bytes) -> dict[str, Any]:
    """``data_b64`` always; ``data`` the text if ``data`` is valid UTF-8, else None."""
    try:
        text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"data_b64": base64.b64encode(data).decode("ascii"), "data": text}


def escape(data: bytes) -> str:
    """A payload as one line of text: tab, newline, CR and backslash escaped, bad bytes \\xNN."""
    out = []
    text = data.decode("utf-8", errors="surrogateescape")
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        else:
            out.append(_ESCAPES.get(code, ch))
    return "".join(out)


def message_doc(m: Any, *, token: bool = False) -> dict[str, Any]:
    """A ``Message`` as JSON: id, [token: its lease token], attempts, priority, enqueued_at,
    key, error, size, data_b64, data."""
    doc: dict[str, Any] = {"id": m.id}
    if token:
        doc["token"] = m.lease
    doc.update(attempts=m.attempts, priority=m.priority, enqueued_at=m.enqueued_at,
               key=m.key or None, error=m.error or None, size=len(m.data))
    doc.update(payload(m.data))
    return doc


def seconds(value: float | None) -> str:
    """A duration, rounded, with its unit: ``0.6 s``, ``42 s``, ``3.5 min``, ``2.0 h``, ``1.5 d``
    (``-`` for None)."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    if value < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def size(n: int) -> str:
    """Bytes, rounded, in binary units: ``512 B``, ``1.5 KiB``, ``12 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.{1 if value < 10 else 0}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


STATS_KEYS = "queue, ready, delayed, leased, pending, dead, oldest_age_s (null: no ready item)"


def shown_stats(s: dict[str, Any]) -> dict[str, Any]:
    """A queue's counters as the CLI shows them: no oldest age when nothing is ready."""
    return {**s, "oldest_age_s": round(s["oldest_age_s"], 3) if s["ready"] else None}


def stats_lines(s: dict[str, Any]) -> list[str]:
    """One queue's counters for people: counts as they are, the oldest age rounded."""
    return [f"queue: {s['queue']}", f"ready: {s['ready']}", f"delayed: {s['delayed']}",
            f"leased: {s['leased']}", f"pending: {s['pending']}", f"dead: {s['dead']}",
            f"oldest age: {seconds(s['oldest_age_s'])}"]


def output(as_json: bool, doc: Any, human: Callable[[], None]) -> None:
    """Print ``doc`` as JSON, or call ``human`` to print text."""
    if as_json:
        echo_json(doc)
    else:
        human()
