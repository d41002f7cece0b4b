"""The ``ip`` commands the namespace harness needs, one small function each.

Every call runs ``ip`` (iproute2) and raises ``IpError`` with its stderr if it fails, so a
harness step that did not happen never passes silently. Root is needed for all but the
listings; ``require_root`` says so in one line before anything is created.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

__all__ = ["IpError", "NamespacesUnavailable", "add_bridge", "add_namespace", "add_veth",
           "blackhole", "delete_link", "delete_namespace", "flush_blackholes", "links",
           "namespace_pids", "namespaces", "require_root", "root_addresses", "set_link",
           "unblackhole"]


class IpError(RuntimeError):
    """Raised when an ``ip`` command fails; the message has the command and its stderr."""


class NamespacesUnavailable(RuntimeError):
    """Raised when network namespaces cannot be made here (not root, or no ``ip`` command)."""


def require_root() -> None:
    """Raise ``NamespacesUnavailable`` unless this process can create network namespaces."""
    if shutil.which("ip") is None:
        raise NamespacesUnavailable("the hosts harness needs the `ip` command (iproute2)")
    if os.geteuid() != 0:
        raise NamespacesUnavailable("the hosts harness creates network namespaces, veths and a "
                                    "bridge (`ip netns add`): it must run as root")


def ip(*args: str, netns: str | None = None) -> str:
    """Run ``ip [-n NETNS] ARGS`` and return its stdout."""
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise IpError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def add_namespace(name: str) -> None:
    ip("netns", "add", name)
    ip("link", "set", "lo", "up", netns=name)


def delete_namespace(name: str) -> None:
    ip("netns", "delete", name)


def namespaces() -> list[str]:
    """Names of the network namespaces ``ip netns`` knows."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """Processes running in namespace ``name``."""
    return [int(pid) for pid in ip("netns", "pids", name).split()]


def add_bridge(name: str, address: str) -> None:
    """A bridge in this namespace with ``address`` (CIDR), up, so this process reaches it."""
    ip("link", "add", name, "type", "bridge")
    ip("addr", "add", address, "dev", name)
    ip("link", "set", name, "up")


def add_veth(outer: str, inner: str, bridge: str, netns: str, address: str) -> None:
    """A veth pair: ``outer`` a port of ``bridge``, ``inner`` moved into ``netns`` as ``eth0``
    with ``address`` (CIDR); both ends up."""
    ip("link", "add", outer, "type", "veth", "peer", "name", inner)
    ip("link", "set", inner, "netns", netns)
    ip("link", "set", outer, "master", bridge, "up")
    ip("link", "set", inner, "name", "eth0", netns=netns)
    ip("addr", "add", address, "dev", "eth0", netns=netns)
    ip("link", "set", "eth0", "up", netns=netns)


def set_link(name: str, up: bool) -> None:
    ip("link", "set", name, "up" if up else "down")


def delete_link(name: str) -> None:
    """Delete a link (a veth's other end goes with it)."""
    ip("link", "delete", name)


def links() -> list[str]:
    """Names of the links in this namespace."""
    return [link["ifname"] for link in json.loads(ip("-j", "link", "show") or "[]")]


def root_addresses() -> list[str]:
    """IPv4 addresses (CIDR) of this namespace's links."""
    return [f"{a['local']}/{a['prefixlen']}" for link in json.loads(ip("-j", "-4", "addr") or "[]")
            for a in link.get("addr_info", [])]


def blackhole(netns: str, address: str) -> None:
    """Drop everything ``netns`` sends to ``address`` (a host route of type blackhole)."""
    ip("route", "add", "blackhole", f"{address}/32", netns=netns)


def unblackhole(netns: str, address: str) -> None:
    ip("route", "delete", "blackhole", f"{address}/32", netns=netns)


def flush_blackholes(netns: str) -> None:
    """Remove every blackhole route of ``netns`` (healing whatever was cut there)."""
    for route in json.loads(ip("-j", "route", "show", "type", "blackhole", netns=netns) or "[]"):
        ip("route", "delete", "blackhole", route["dst"], netns=netns)
