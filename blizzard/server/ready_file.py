"""A server's ready file: written once it serves, so whoever started it need not read its log.

``DATA_DIR/ready`` holds one JSON object: the server's process id, the address it serves on
and, for a master, its cluster id. The server writes it when its loop starts (its socket is
bound by then), atomically: a reader sees the whole file or none. A server that closes
removes it; one that was killed leaves it behind, so whoever starts a server on a data dir
removes the file first (``blizzard/local/harness.py``) or checks its pid.
"""

from __future__ import annotations

import json
import os
from typing import Any

NAME = "ready"


def path(data_dir: str) -> str:
    return os.path.join(data_dir, NAME)


def write(data_dir: str, **facts: Any) -> None:
    """Say the server serves: ``facts`` (JSON values) in ``DATA_DIR/ready``, written whole."""
    tmp = path(data_dir) + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(facts, f)
    os.replace(tmp, path(data_dir))


def remove(data_dir: str) -> None:
    """The server no longer serves (or is about to start): no ready file."""
    try:
        os.unlink(path(data_dir))
    except FileNotFoundError:
        pass


def read(data_dir: str) -> dict[str, Any] | None:
    """What the server wrote, or None while it has not said it serves."""
    try:
        with open(path(data_dir)) as f:
            facts = json.load(f)
    except FileNotFoundError:
        return None
    return facts if isinstance(facts, dict) else None
