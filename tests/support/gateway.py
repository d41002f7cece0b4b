"""``blizzard beanstalkd`` as a process of its own, for the tests that need the real command."""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Any

from support.cli import BLIZZARD

from blizzard.net import keys as k


def gateway_process(master: str, port: int, **popen: Any) -> subprocess.Popen[bytes]:
    """``blizzard beanstalkd --listen 127.0.0.1:PORT`` for an insecure cluster at ``master``."""
    env = dict(os.environ, BLIZZARD_MASTER=master)
    env.pop(k.ENV, None)
    return subprocess.Popen([*BLIZZARD, "beanstalkd", "--listen", f"127.0.0.1:{port}"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False
