"""``blizzard sqs``: Amazon SQS's API in front of a replicated Blizzard cluster.

An HTTP server (Python's ``http.server``, with ``GuardedHTTPServer``'s bounds: connections
at once and per address, a request head due within ``HEAD_S``, idle and slow connections
cut) takes both of SQS's wire forms on one port (``sqs_wire``), checks each request's AWS
Signature Version 4 against ``--credentials`` (``sigv4``), and runs the action
(``sqs_actions``) with a Blizzard client of the caller's role. Each connection is served in a
thread of its own with clients of its own, made when first needed and closed with it.

Bounds: a request body of at most ``MAX_BODY`` bytes (``Content-Length`` required), a request
at most ``REQUEST_S`` from its first byte to its reply's last (a long poll waits at most 20 s
of it), at most ``max_connections`` connections.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

import zmq

from blizzard.client.core import Client
from blizzard.gateways import sqs_wire as wire
from blizzard.gateways.batcher import Batcher
from blizzard.gateways.sigv4 import Credential, SignatureError, load_credentials, verify
from blizzard.gateways.sqs_actions import Actions, Caller
from blizzard.gateways.sqs_messages import Receipts
from blizzard.gateways.sqs_wire import SqsError
from blizzard.host import fd_limits
from blizzard.host.log_limit import Throttled
from blizzard.net import keys
from blizzard.net.http_guard import IDLE_TIMEOUT_S, GuardedHTTPServer
from blizzard.wire.errors import BlizzardError, ClusterError, TooManyQueues

log = logging.getLogger(__name__)
trouble = Throttled(log)

MAX_BODY = 3 * 1024 * 1024  # a batch of 10 messages of 1 MiB in all, as JSON or a form
REQUEST_S = 60.0  # a request's head, body, work (a 20 s long poll) and reply, at most
MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class SqsConfig:
    master: str
    listen_host: str = "127.0.0.1"
    listen_port: int = 9324
    credentials: str | None = None  # file of ACCESS_KEY_ID SECRET ROLE lines; None: anyone
    admin: bool = False  # the gateway holds the cluster's admin key (for admin-role callers)
    region: str = "us-east-1"  # in ARNs
    max_connections: int = MAX_CONNECTIONS
    allow_hosts: tuple[str, ...] = ()  # Host names answered besides the bind address
    timeout_s: float = 30.0  # each cluster call's


class SqsServer(GuardedHTTPServer):
    """``GuardedHTTPServer`` whose deadline is per request (a kept-alive connection may serve
    many), with the gateway's actions and keys."""

    block_on_close = False
    head_s = 10.0

    def __init__(self, config: SqsConfig,
                 client_factory: Callable[[bool], Any] | None = None) -> None:
        self.config = config
        self.keys: dict[str, Credential] | None = None
        handle_key = os.urandom(32)
        if config.credentials:
            self.keys = load_credentials(config.credentials)
            # gateways given the same credentials accept each other's receipt handles
            handle_key = hashlib.sha256(b"blizzard-sqs-receipts\0" + "\0".join(
                f"{c.key_id}:{c.secret}" for c in sorted(self.keys.values(),
                                                         key=lambda c: c.key_id)).encode()
                                        ).digest()
        self.actions = Actions(Receipts(handle_key), config.region)
        fd_limits.raise_fd_limit()
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 64 + 16 * config.max_connections)
        self.client_factory = client_factory or self._client
        self._batchers: dict[bool, Batcher] = {}
        self._batchers_lock = threading.Lock()
        super().__init__((config.listen_host, config.listen_port), _Handler, config.allow_hosts,
                         config.max_connections, REQUEST_S, any_ip=True)

    def _client(self, admin: bool) -> Any:
        # without keys the cluster takes everyone as an admin: no admin key to ask for
        client = Client(self.config.master, timeout_s=self.config.timeout_s,
                        admin=admin and bool(os.environ.get(keys.ENV)), ctx=self.ctx)
        if not isinstance(client, Client):  # several shards
            client.close()
            raise SqsError("AWS.SimpleQueueService.UnsupportedOperation",
                           "this gateway serves one shard's masters")
        return client

    def batcher(self, admin: bool) -> Batcher:
        """The sends and deletes of all connections of one role, in batches."""
        with self._batchers_lock:
            made = self._batchers.get(admin)
            if made is None:
                made = self._batchers[admin] = Batcher(lambda: self.client_factory(admin))
            return made

    def head_read(self, conn: socket.socket) -> None:
        """The request head is in: the rest of the request has ``REQUEST_S`` from now."""
        with self.deadlines_lock:
            if conn in self.deadlines:
                end = time.monotonic() + self.connection_s
                self.deadlines[conn] = (end, end)

    def awaiting_head(self, conn: socket.socket) -> None:
        """Waiting for the next request on a kept-alive connection: its head is due in
        ``head_s``."""
        with self.deadlines_lock:
            if conn in self.deadlines:
                now = time.monotonic()
                self.deadlines[conn] = (now + self.head_s, now + self.head_s + self.connection_s)

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def server_close(self) -> None:
        super().server_close()
        for made in self._batchers.values():
            made.stop()
        self._batchers.clear()


class _Handler(BaseHTTPRequestHandler):
    server_version = "blizzard-sqs"
    protocol_version = "HTTP/1.1"  # kept-alive connections, as SDKs pool them
    # a reply's head and body are two writes: with Nagle's algorithm the body waited for the
    # client's delayed ACK, 40 ms a request
    disable_nagle_algorithm = True
    timeout = IDLE_TIMEOUT_S
    server: SqsServer

    def setup(self) -> None:
        super().setup()
        self.clients: dict[bool, Any] = {}

    def finish(self) -> None:
        for client in self.clients.values():
            try:
                client.close()
            except Exception:  # closing must not hide why the connection ended
                log.debug("closing a client failed", exc_info=True)
        self.clients.clear()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        request_id = next(_REQUEST_IDS)
        as_json = "X-Amz-Target" in self.headers
        action = ""
        try:
            body = self._body()
            if not self.server.answers_to(self.headers.get("Host")):
                raise SqsError("AccessDenied", "this gateway answers only to its own address, "
                                               "localhost or a name given with --allow-host")
            cred = self._signer(body)
            if as_json:
                action, params = wire.from_json(self.headers["X-Amz-Target"], body)
            else:
                target = urlsplit(self.path)
                action, params = wire.from_form(wire.form_pairs(body, target.query))
                if "QueueUrl" not in params and target.path.strip("/"):
                    params["QueueUrl"] = target.path  # the query API's queue: the URL posted to
            caller = self._caller(cred)
            result = self.server.actions.run(action, params, caller)
            if as_json:
                reply, kind = json.dumps(result).encode(), wire.JSON_TYPE
            else:
                reply, kind = wire.to_xml(action, result, request_id), "text/xml"
        except SqsError as exc:
            self._error(exc, as_json, request_id)
            return
        except TooManyQueues as exc:
            self._error(SqsError("OverLimit", str(exc)), as_json, request_id)
            return
        except ClusterError as exc:
            trouble("cluster", "the cluster did not serve a request: %s", exc)
            self._error(SqsError("ServiceUnavailable", f"the cluster is unavailable: {exc}"),
                        as_json, request_id)
            return
        except BlizzardError as exc:
            self._error(SqsError("InvalidParameterValue", str(exc)), as_json, request_id)
            return
        except _Cut:
            self.close_connection = True
            return
        except Exception:  # a bug costs this request, never the gateway
            log.exception("internal error in an SQS %s request", action or "(unparsed)")
            self._error(SqsError("InternalError", "internal error; the gateway's log has it"),
                        as_json, request_id)
            return
        self._send(200, reply, kind, request_id)

    def _body(self) -> bytes:
        """The request's body by its one Content-Length. Framing two parties could read two
        ways (a Transfer-Encoding, two lengths) is refused and the connection closed, so a
        proxy in front and this gateway never see different requests."""
        if self.headers.get_all("Transfer-Encoding"):
            self._plain(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, no Transfer-Encoding")
            raise _Cut()
        lengths = self.headers.get_all("Content-Length") or ["0"]
        length = lengths[0].strip()
        if len(lengths) > 1 or not (length.isascii() and length.isdigit()):
            self._plain(HTTPStatus.BAD_REQUEST, "give one Content-Length, in digits")
            raise _Cut()
        n = int(length)
        if n > MAX_BODY:
            self._plain(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"a request body is at most {MAX_BODY} bytes")
            raise _Cut()
        body = self.rfile.read(n)
        if len(body) != n:
            raise _Cut()
        return body

    def _signer(self, body: bytes) -> Credential | None:
        keys = self.server.keys
        if keys is None:
            return None
        try:
            return verify(self.command, self.path, self.headers, body, keys)
        except SignatureError as exc:
            trouble("signature", "refused a request from %s: %s", self.client_address[0],
                    exc.code)
            raise SqsError(exc.code, exc.message) from None

    def _caller(self, cred: Credential | None) -> Caller:
        if cred is None:  # no --credentials: anyone, with the gateway's own powers
            role = "admin" if self.server.config.admin else "client"
        else:
            role = cred.role
        admin = role == "admin" and self.server.config.admin
        client = self.clients.get(admin)
        if client is None:
            client = self.clients[admin] = self.server.client_factory(admin)
        host = self.headers.get("Host") or f"{self.server.config.listen_host}:" \
                                           f"{self.server.server_port}"
        return Caller(client, role, f"http://{host}", self.server.batcher(admin))

    def _error(self, exc: SqsError, as_json: bool, request_id: str) -> None:
        if as_json:
            body, headers = wire.json_error(exc)
            self._send(exc.status, body, wire.JSON_TYPE, request_id, headers)
        else:
            self._send(exc.status, wire.xml_error(exc, request_id), "text/xml", request_id)

    def _send(self, status: int, body: bytes, kind: str, request_id: str,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-amzn-RequestId", request_id)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self._headers_buffer.extend((b"\r\n", body))  # type: ignore[attr-defined]  # one write
        self.flush_headers()

    def _plain(self, status: int, text: str) -> None:
        body = (text + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def _request_ids() -> Iterator[str]:
    """Request ids shaped as SQS's (a UUID), unique per process: a random prefix, a count."""
    prefix = uuid.uuid4().hex
    for n in itertools.count():
        yield f"{prefix[:8]}-{prefix[8:12]}-{prefix[12:16]}-{prefix[16:20]}-{n:012x}"


_REQUEST_IDS = _request_ids()


class _Cut(Exception):
    """The request cannot be read: answered plainly (or not at all) and the connection ends."""
