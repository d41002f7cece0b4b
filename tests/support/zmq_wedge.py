"""Ways a client process's ZeroMQ context could stop for good, each run in a process of its own
(``python tests/support/zmq_wedge.py SCENARIO``) because a stopped context cannot even be closed.

ZeroMQ's I/O thread hands each monitored event to the monitor with a blocking send; it stopped
when the monitor's reading end was full or gone, and every socket of the context with it. The
process prints ``works`` if a fresh endpoint on the same context is still answered, else
``stopped``, then how many events were left unread; it exits without closing the context.

- ``dropped``: endpoints dropped without ``close()`` while their CURVE handshake is under way
  (the server's ZAP handler answers slowly); the garbage collector used to close the monitor's
  reading end before the socket finished its handshake. Creating so many also reuses file
  descriptors, which once gave "Address already in use" for pyzmq's monitor names.
- ``unread``: thousands of refused handshakes on one endpoint whose events nobody reads (a
  client idle while its server's port answers and hangs up); more than 2,000 used to fill
  the monitor.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import zmq

from blizzard.net.keys import ClientKeys
from blizzard.net.secure import HandshakeWatch
from blizzard.net.transport import Endpoint, call
from blizzard.wire import protocol as p


def curve_echo_server(zap_delay_s: float) -> tuple[str, ClientKeys]:
    """A CURVE ROUTER echoing every request, whose ZAP handler takes ``zap_delay_s`` to let a
    connection in; its address and the keys a client needs."""
    ctx = zmq.Context()
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    zap = ctx.socket(zmq.REP)
    zap.bind("inproc://zeromq.zap.01")

    def admit() -> None:
        while True:
            request = zap.recv_multipart()
            time.sleep(zap_delay_s)
            zap.send_multipart([request[0], request[1], b"200", b"OK", b"client", b""])

    router = ctx.socket(zmq.ROUTER)
    router.curve_server = True
    router.curve_secretkey, router.curve_publickey = server_secret, server_public
    port = router.bind_to_random_port("tcp://127.0.0.1")

    def echo() -> None:
        while True:
            router.send_multipart(router.recv_multipart())

    threading.Thread(target=admit, daemon=True).start()
    threading.Thread(target=echo, daemon=True).start()
    return f"tcp://127.0.0.1:{port}", ClientKeys(client_public, client_secret, server_public)


class HangUpServer:
    """A TCP port that accepts every connection and closes it at once (a refused handshake),
    counting them."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.addr = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            conn.close()
            self.accepted += 1


def dropped(ctx: zmq.Context, addr: str, keys: ClientKeys) -> None:
    for i in range(300):
        ep = Endpoint(ctx, addr, keys, keys.master)
        ep.send(p.Hello())
        time.sleep(0.001 * (i % 10))  # let the handshakes get to different stages
        del ep  # dropped mid-handshake, never closed


def unread(ctx: zmq.Context, refusals: int = 3000) -> HandshakeWatch:
    """A socket reconnecting every millisecond to a port that hangs up, watched as an
    endpoint's socket is, its events left unread until ``refusals`` connections were made."""
    server = HangUpServer()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 1)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1)
    watch = HandshakeWatch(sock, server.addr, secure=False)
    sock.connect(server.addr)
    deadline = time.monotonic() + 60
    while server.accepted < refusals and time.monotonic() < deadline:
        time.sleep(0.05)
    return watch


def main(scenario: str) -> None:
    addr, keys = curve_echo_server(zap_delay_s=0.005)
    ctx = zmq.Context.instance()
    watch = None
    if scenario == "dropped":
        dropped(ctx, addr, keys)
    else:
        watch = unread(ctx)
    ep = Endpoint(ctx, addr, keys, keys.master)
    try:
        call(ep, p.Hello(), 5.0)
        outcome = "works"
    except TimeoutError:
        outcome = "stopped"
    events = 0
    while watch is not None and watch.monitor.poll(0):  # how many were left unread
        watch.monitor.recv_multipart()
        events += 1
    print(outcome, events, flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
