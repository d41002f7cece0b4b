"""The client's connection to the master: requests retried with back-off until a deadline.

Retrying is safe: places are cheap to repeat; enqueues, commits and acks are idempotent; and a
lease carries a request id so its retry returns the same items. A master that restarts answers
``master_starting`` until it has replayed its log; that, like silence, is waited out. But
where nothing listens (every connection refused) and no master ever answered, the client says
so within seconds (``MasterUnavailable`` with ``refused``) instead of waiting out its timeout.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import zmq

from blizzard.net.keys import ClientKeys
from blizzard.net.master_hints import GIVEN, nothing_listens, start_hint
from blizzard.net.masters import MasterChoice
from blizzard.net.secure import ConnectionRefused
from blizzard.net.transport import Endpoint, call, call_many, raise_if_error
from blizzard.wire import protocol as p
from blizzard.wire.errors import (
    AuthenticationFailed,
    BlizzardError,
    ClientClosed,
    MasterUnavailable,
)

log = logging.getLogger(__name__)

ATTEMPT_S = 2.0  # one try at a master request before it is sent again (a restart loses it)
FIRST_PAUSE_S = 0.05  # the pause before the first retry; it doubles up to MAX_PAUSE_S
MAX_PAUSE_S = 1.0
FAILOVER_ATTEMPT_S = 1.0  # the same with several masters: a silent one is left sooner
FAILOVER_MAX_PAUSE_S = 0.25
PROBE_S = 0.4  # with several masters, a parked request's master is pinged this often
REFUSED_S = 1.0  # a connection refused this long (none made) before a call: nothing listens
RETRYABLE = {"master_starting", "not_primary"}  # not_primary: a standby, until it is promoted


class MasterLink:
    """Requests to the master, each retried until ``timeout_s`` after it was first sent.

    ``addr`` may name several masters (a primary and its standby, ``tcp://a,tcp://b``): a
    request that times out, or that a standby refuses (``NotPrimary``), goes to the next one
    (``blizzard/net/masters.py``), so a call rides through a failover within its ``timeout_s``.
    """

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addr: str | Sequence[str], *,
                 timeout_s: float, keys: ClientKeys | None = None, origin: str = GIVEN) -> None:
        """``origin``: where ``addr`` came from, told when nothing listens there."""
        self.ctx = ctx
        self.origin = origin
        self.refused: set[str] = set()  # addresses that refused the connection outright
        self.keys = keys
        self.choice = MasterChoice(addr)
        self.epoch = 0  # the newest master epoch seen (``_check_epoch``)
        self.endpoints: dict[str, Endpoint] = {}
        self.closed = False  # by ``close``: no connection is made again
        self._current = self._endpoint()
        self._found = len(self.choice.addrs) == 1  # which master is primary: asked at first use
        self._node_key = keys.datanode if keys else None
        self.timeout_s = timeout_s
        # 64 random bits per call (the master remembers a lease's call id: none may guess the
        # next), drawn without building a uuid; a counter after them, for logs
        self._call_ids = (f"{os.urandom(8).hex()}-{n}" for n in itertools.count())

    @property
    def addr(self) -> str:
        return ",".join(self.choice.addrs)

    @property
    def endpoint(self) -> Endpoint:
        """The master requests go to now. Given several, the first use asks them all which
        is the primary, so a client started after a failover does not wait on the old one."""
        if not self._found:
            self._found = True
            self._find_primary()
        return self._current

    def all_endpoints(self) -> list[Endpoint]:
        """The connection to every master this link may use, in the order given."""
        return [self._endpoint(a) for a in self.choice.addrs]

    def _find_primary(self) -> None:
        endpoints = self.all_endpoints()
        replies = call_many([(ep, p.Hello()) for ep in endpoints], FAILOVER_ATTEMPT_S / 2)
        for ep, reply in zip(endpoints, replies, strict=True):
            self._note_refusal(ep.addr, reply)
        primaries = [(w.epoch, -i) for i, w in enumerate(replies)
                     if isinstance(w, p.Welcome) and not w.primary]
        self.epoch = max([w.epoch for w in replies if isinstance(w, p.Welcome)], default=0)
        if primaries:
            self.choice.index = -max(primaries)[1]
            self._current = self._endpoint()

    def _endpoint(self, addr: str | None = None) -> Endpoint:
        """The connection to ``addr`` (default: the current master), made once."""
        addr = addr or self.choice.current
        if addr not in self.endpoints:
            if self.closed:
                raise ClientClosed()
            self.endpoints[addr] = Endpoint(self.ctx, addr, self.keys,
                                            self.keys.master if self.keys else None)
        return self.endpoints[addr]

    def node_key(self) -> bytes | None:
        """The data nodes' public key (asked of the master once if the keys did not hold it);
        None when this client runs without keys."""
        if self.keys is not None and self._node_key is None:
            welcome = self.call(p.Hello())
            self._node_key = welcome.node_key or None
        return self._node_key

    def call_id(self) -> str:
        """A fresh id for a request the master must apply at most once (commit, lease)."""
        return next(self._call_ids)

    def call_many(self, msgs: list[Any], extra_s: float = 0.0, raise_errors: bool = True,
                  since: float | None = None, also: Iterable[Endpoint] = (),
                  genuine: Callable[[int, Any], bool] | None = None) -> list[Any]:
        """Send requests at once, resending those not answered, until the deadline.

        The deadline is ``timeout_s + extra_s`` after ``since`` (a monotonic time; default
        now). With ``raise_errors`` False, error replies are returned as ``protocol.Error``.
        ``also``, ``genuine``: endpoints the replies may come on as well, and which of those to
        take (``transport.call_many``).
        """
        deadline = (time.monotonic() if since is None else since) + self.timeout_s + extra_s
        results: list[Any] = [None] * len(msgs)
        todo = list(range(len(msgs)))
        retries = 0
        while True:
            attempt_s = min(deadline - time.monotonic(), self.attempt_s + extra_s)
            ep = self.endpoint
            if not self.answered:  # a request sent without us (the pipeline's) may have waited
                self._note_refusal(ep.addr, ep.silence("before a call", REFUSED_S))
                self._raise_if_none_listens()
            # a parked request is pinged (``probe_s``): with a standby, so a dead master is
            # left soon; before any master answered, so a refused connection is told soon
            probe = extra_s and (self.standby or not self.answered)
            replies = call_many([(ep, msgs[i]) for i in todo], max(attempt_s, 0.01),
                                probe_s=PROBE_S if probe else None, also=also,
                                genuine=genuine)
            again = []
            for i, reply in zip(todo, replies, strict=True):
                if isinstance(reply, AuthenticationFailed):
                    raise reply  # no retry gets past a refused key
                self._note_refusal(ep.addr, reply)
                results[i] = reply
                if isinstance(reply, TimeoutError) or is_retryable(reply):
                    again.append(i)
            if again:
                self._raise_if_none_listens()
                self.move_on(results[again[0]])
            if not again:
                return [raise_if_error(r) for r in results] if raise_errors else results
            pause = retry_pause_s(retries, random.random(), self.max_pause_s)
            retries += 1
            if time.monotonic() + pause >= deadline:
                last = results[again[0]]
                if isinstance(last, p.Error):
                    raise_if_error(last)
                now = "; now nothing listens there (the connection is refused)" \
                    if isinstance(last, ConnectionRefused) else ""
                raise MasterUnavailable(f"master {self.addr} did not answer within "
                                        f"{self.timeout_s + extra_s:g}s{now}")
            time.sleep(pause)
            todo = again

    @property
    def answered(self) -> bool:
        """Some master replied on this link at some time (to any request, whoever sent it):
        a refusal from then on is a restart, waited out."""
        return any(ep.answered for ep in self.endpoints.values())

    def _note_refusal(self, addr: str, reply: Any) -> None:
        """Note whether the master at ``addr`` refused the connection outright."""
        if isinstance(reply, ConnectionRefused):
            self.refused.add(addr)

    def _raise_if_none_listens(self) -> None:
        """``MasterUnavailable`` (``refused``) if every master address refused the connection
        and none ever answered: nothing runs there, and waiting out ``timeout_s`` would only
        hide that. (A master that answered once and now refuses is restarting: waited out.)"""
        if not self.answered and self.refused.issuperset(self.choice.addrs):
            raise MasterUnavailable(f"{nothing_listens(self.addr)}; "
                                    f"{start_hint(self.origin, cli=False)}", self.addr, True)

    def call(self, msg: Any, extra_s: float = 0.0, since: float | None = None,
             also: Iterable[Endpoint] = (),
             genuine: Callable[[int, Any], bool] | None = None) -> Any:
        """One request (see ``call_many``); raises the reply's ``BlizzardError``."""
        return self.call_many([msg], extra_s, since=since, also=also, genuine=genuine)[0]

    def enqueue_wait_s(self, node_wait_s: float) -> float:
        """How long the pipeline waits for an enqueue the master may park ``node_wait_s`` for
        reports, before it asks again the slow way (which, with a standby, checks the master
        is alive meanwhile)."""
        return node_wait_s + ATTEMPT_S if len(self.choice.addrs) == 1 else FAILOVER_ATTEMPT_S

    @property
    def max_pause_s(self) -> float:
        """The longest pause between tries: shorter with a standby, which takes over any moment."""
        return MAX_PAUSE_S if len(self.choice.addrs) == 1 else FAILOVER_MAX_PAUSE_S

    @property
    def standby(self) -> bool:
        """Given several masters: one may take over from another."""
        return len(self.choice.addrs) > 1

    @property
    def attempt_s(self) -> float:
        """One try's wait: shorter with a standby to turn to, so a failover is noticed soon."""
        return ATTEMPT_S if len(self.choice.addrs) == 1 else FAILOVER_ATTEMPT_S

    def move_on(self, reply: Any) -> None:
        """After a timeout or a standby's refusal, maybe ask the next master."""
        moved = self.choice.timed_out() if isinstance(reply, TimeoutError) else \
            isinstance(reply, p.Error) and reply.code == "not_primary" and self.choice.not_primary()
        if moved:
            self._current = self._endpoint()
            self._check_epoch()

    def _check_epoch(self) -> None:
        """Learn the epoch of the master just turned to; one older than an epoch seen already
        is left at once: an old primary that was replaced (and, with no sync standby, maybe
        not fenced) must not take this client's requests."""
        for _ in self.choice.addrs:
            try:
                welcome = call(self.endpoint, p.Hello(), FAILOVER_ATTEMPT_S)
            except (TimeoutError, BlizzardError):
                return  # silent or refusing: the request's own try finds that out
            if welcome.epoch >= self.epoch:
                self.epoch = welcome.epoch
                return
            log.warning("master %s is of epoch %d, older than %d: not using it",
                        self.endpoint.addr, welcome.epoch, self.epoch)
            self.choice.timed_out()
            self._current = self._endpoint()

    def close(self) -> None:
        self.closed = True
        for endpoint in self.endpoints.values():
            endpoint.close()


def is_retryable(reply: Any) -> bool:
    """An error reply that a resend may get past (the master is still starting)."""
    return isinstance(reply, p.Error) and reply.code in RETRYABLE


def retry_pause_s(retries: int, rand: float, max_pause_s: float = MAX_PAUSE_S) -> float:
    """The pause before retry number ``retries`` (0: the first): exponential, with jitter.

    ``rand`` in [0, 1) spreads it over [half, all] of the exponential step, so clients that
    lost a master together do not all come back at the same moment after its restart.
    """
    step: float = min(max_pause_s, FIRST_PAUSE_S * 2 ** min(retries, 20))
    return step * (0.5 + rand / 2)
