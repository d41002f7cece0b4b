"""The servers' log output: text for people (the default), or JSON lines for log collectors.

Only the command lines call ``setup``; library code just logs through
``logging.getLogger(__name__)``. A JSON line is one object:
``{"time", "level", "logger", "message", "role", "node_id", "addr"}`` plus ``"exception"``
(the formatted traceback) when a record carries one. ``time`` is UTC, ISO 8601 with
milliseconds; ``role`` is ``master``, ``datanode`` or ``worker``; ``node_id`` is a data node's
id (null elsewhere, and in a data node's lines before it has read its id); ``addr`` is the
address the process serves (a worker's: its master's).
"""

from __future__ import annotations

import datetime
import json
import logging
import sys

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class ProcessFields(logging.Filter):
    """Stamps every record with who wrote it; ``node_id`` is set once the server knows it."""

    def __init__(self, role: str, addr: str) -> None:
        super().__init__()
        self.role = role
        self.addr = addr
        self.node_id: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        record.node_id = self.node_id
        record.addr = self.addr
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        doc = {"time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname, "logger": record.name,
               "message": record.getMessage(), "role": getattr(record, "role", None),
               "node_id": getattr(record, "node_id", None), "addr": getattr(record, "addr", None)}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc)


def setup(level: str, fmt: str, role: str, addr: str) -> ProcessFields:
    """Send every log record of this process to stderr as ``fmt`` (text or json) from
    ``level`` up; returns the fields stamped on records, for the caller to complete."""
    fields = ProcessFields(role, addr)
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(fields)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler], force=True)
    return fields
