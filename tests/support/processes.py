"""What tests ask of the processes they start: stop one politely, find some, list where some
listen."""

from __future__ import annotations

import os
import subprocess

# /proc/net/tcp{,6} spellings of 127.0.0.1, ::1 and ::ffff:127.0.0.1
LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000",
                "0000000000000000FFFF00000100007F"}


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def pids_with(fragment: str, part: str = "cmdline") -> list[int]:
    """Pids of running processes whose ``/proc/PID/<part>`` (command line, environment) holds
    ``fragment``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as f:
                if fragment.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def listening_addresses(pids: list[int]) -> list[str]:
    """The hex addresses (as /proc/net/tcp writes them) of sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    listening.append(cols[1].split(":")[0])
    return listening
