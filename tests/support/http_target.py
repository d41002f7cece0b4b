"""A real HTTP endpoint for dispatch tests: aiohttp.web on a free 127.0.0.1 port, in a thread.

Each URL says how to answer, so a test needs no set-up call: ``target.url("t7", "503,drop,ok")``
answers the first request to ``/t7`` with a 503, drops the connection of the second without a
reply, and answers 200 from the third on (the last action repeats). Actions:

- ``ok`` (200), or a status code such as ``503``;
- ``slow:S``: wait S seconds, then 200;
- ``drop``: close the connection without a reply.

Every request is recorded on arrival (key, monotonic time, method, body), so a test can check
back-offs and rates from arrival times.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

from aiohttp import web

from blizzard.local.harness import free_port


@dataclass(frozen=True)
class Arrival:
    key: str
    at: float  # time.monotonic() when the request arrived
    method: str
    body: bytes
    headers: dict[str, str]


class HttpTarget:
    """The endpoint; ``start()`` returns once it listens, ``stop()`` shuts it down."""

    def __init__(self) -> None:
        self.port = free_port()
        self.arrivals: list[Arrival] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def url(self, key: str, plan: str = "ok") -> str:
        return f"http://127.0.0.1:{self.port}/{key}?plan={plan}"

    def start(self) -> HttpTarget:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def times(self, key: str) -> list[float]:
        """Arrival times of the requests to ``key``, in order."""
        with self._lock:
            return [a.at for a in self.arrivals if a.key == key]

    def keys(self) -> set[str]:
        with self._lock:
            return {a.key for a in self.arrivals}

    def count(self) -> int:
        with self._lock:
            return len(self.arrivals)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{key}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        at = time.monotonic()
        key = request.match_info["key"]
        body = await request.read()
        with self._lock:
            n = sum(1 for a in self.arrivals if a.key == key)
            self.arrivals.append(Arrival(key, at, request.method, body, dict(request.headers)))
        plan = request.query.get("plan", "ok").split(",")
        action = plan[min(n, len(plan) - 1)]
        if action == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never reaches the client
        if action.startswith("slow:"):
            await asyncio.sleep(float(action.split(":")[1]))
            action = "ok"
        status = 200 if action == "ok" else int(action)
        return web.Response(status=status, text=f"{key} answered {status}")
