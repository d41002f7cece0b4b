"""What ``blizzard beanstalkd`` reports: ``stats``, ``stats-tube``, ``stats-job`` and the
tubes ``list-tubes`` lists, as beanstalkd 1.12 has them, from the cluster's queues and the
gateway's own counters (``beanstalk_stats.py``). Each takes the connection's ``Session``."""

from __future__ import annotations

import os
import platform
import resource
import time
from collections import Counter
from typing import Any

from blizzard.client.http_delivery import lookup
from blizzard.gateways.beanstalk_lines import line, pri_of, with_body, yaml_dict
from blizzard.gateways.beanstalk_stats import COMMANDS
from blizzard.wire.errors import BlizzardError, Forbidden
from blizzard.wire.queue_settings import DEAD_SUFFIX
from blizzard.wire.release import RELEASE

DEFAULT_TUBE = "default"


def tube_of(queue: str) -> str:
    """The tube a job of ``queue`` belongs to: a buried job's is the queue whose dead-letter
    queue holds it."""
    return queue[:-len(DEAD_SUFFIX)] if queue.endswith(DEAD_SUFFIX) else queue


def tubes(session: Any, queues: list[dict[str, Any]] | None = None) -> list[str]:
    """The tubes beanstalkd would have: the default one, those a connection uses or
    watches, and the cluster's queues that hold jobs (but for dead-letter queues: their
    jobs are their tubes' buried ones). beanstalkd forgets a tube once nothing refers to
    it and it is empty; the cluster keeps the queue, unlisted until it holds jobs again."""
    queues = session.client.queues() if queues is None else queues
    names = {q["queue"] for q in queues if not q["queue"].endswith(DEAD_SUFFIX)
             and q["ready"] + q["leased"] + q["delayed"] + q["dead"] + q["pending"]}
    names |= _referenced(session)
    return [DEFAULT_TUBE, *sorted(names - {DEFAULT_TUBE})]


def _referenced(session: Any) -> set[str]:
    """The tubes the gateway's connections use or watch."""
    names: set[str] = set()
    for other in list(session.gateway.sessions):
        names.add(other.used)
        names.update(other.watched)
    return names


def stats(session: Any) -> bytes:
    """beanstalkd 1.12's fields, in its order: the jobs of the cluster's tubes, this
    gateway's counters since it started, its connections; what has no meaning here (the
    binlog) is 0."""
    gw, counts = session.gateway, session.gateway.counters
    queues = session.client.queues()
    held = [q for q in queues if not q["queue"].endswith(DEAD_SUFFIX)]
    sessions = list(gw.sessions)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with counts.lock:
        commands = {f"cmd-{name}": counts.commands[name] for name in COMMANDS}
        total_jobs = counts.total_jobs
    fields: dict[str, Any] = {
        "current-jobs-urgent": 0,
        "current-jobs-ready": sum(q["ready"] for q in held),
        "current-jobs-reserved": sum(q["leased"] for q in held),
        "current-jobs-delayed": sum(q["delayed"] for q in held),
        "current-jobs-buried": sum(q["dead"] for q in held),
        **commands,
        "job-timeouts": 0, "total-jobs": total_jobs, "max-job-size": gw.config.max_job_bytes,
        "current-tubes": len(tubes(session, queues)),
        "current-connections": len(sessions),
        "current-producers": sum(s.produced for s in sessions),
        "current-workers": sum(s.worked for s in sessions),
        "current-waiting": sum(s.waiting for s in sessions),
        "total-connections": gw.connections, "pid": os.getpid(),
        "version": f"blizzard-{RELEASE}",
        "rusage-utime": f"{usage.ru_utime:.6f}", "rusage-stime": f"{usage.ru_stime:.6f}",
        "uptime": int(time.time() - gw.started),
        "binlog-oldest-index": 0, "binlog-current-index": 0, "binlog-records-migrated": 0,
        "binlog-records-written": 0, "binlog-max-size": 0,
        "draining": "true" if gw.draining.is_set() else "false", "id": gw.server_id,
        "hostname": platform.node(), "os": platform.version(), "platform": platform.machine()}
    return with_body("OK", body=yaml_dict(fields))


def stats_tube(session: Any, tube: str) -> bytes:
    try:
        seen = session.client.admin.describe(tube)
    except BlizzardError:
        return line("NOT_FOUND")
    sessions = list(session.gateway.sessions)
    watching = sum(tube in s.watched for s in sessions)
    using = sum(s.used == tube for s in sessions)
    held = seen.ready + seen.leased + seen.delayed + seen.dead + seen.pending
    if tube != DEFAULT_TUBE and not (held or watching or using):
        return line("NOT_FOUND")  # as beanstalkd: a tube no one refers to and empty is not
    settings: Any = seen.settings  # with_settings adds the fields, which mypy cannot see
    left = max(0, int(settings.paused_until - time.time() + 0.999))
    counts = session.gateway.counters
    with counts.lock:
        jobs, deletes, pauses = (counts.tube_jobs[tube], counts.tube_deletes[tube],
                                 counts.tube_pauses[tube])
    fields = {"name": tube, "current-jobs-urgent": 0,
              "current-jobs-ready": seen.ready, "current-jobs-reserved": seen.leased,
              "current-jobs-delayed": seen.delayed, "current-jobs-buried": seen.dead,
              "total-jobs": jobs, "current-using": using, "current-watching": watching,
              "current-waiting": sum(s.waiting and tube in s.watched for s in sessions),
              "cmd-delete": deletes, "cmd-pause-tube": pauses, "pause": left,
              "pause-time-left": left}
    return with_body("OK", body=yaml_dict(fields))


def stats_job(session: Any, job: int) -> bytes:
    found = lookup(session.client, [job]) if 0 <= job < 2**63 else []
    if not found or not found[0]["queue"]:
        return line("NOT_FOUND")
    item = found[0]
    state = {"queued": "ready", "scheduled": "delayed", "in_flight": "reserved",
             "failed": "buried"}.get(item["state"], item["state"])
    seen: Any = session.reserved.get(job)
    if seen is None:
        try:  # its priority and ttr (the admin key; without it they read 0)
            seen = next(iter(session.client.admin.peek_items(item["queue"], ids=[job])), None)
        except Forbidden:
            seen = None
    # what this gateway counted of the job; else the cluster's attempts (and this one)
    counted = session.gateway.counters.of_job(job)
    if counted is None:
        counted = Counter(reserves=item["attempts"] + (state == "reserved"))
    now = time.time()
    fields = {"id": job, "tube": tube_of(item["queue"]), "state": state,
              "pri": pri_of(seen.priority) if seen is not None else 0,
              "age": int(now - seen.enqueued_at) if seen is not None else 0,
              "delay": 0,
              "ttr": int(session.ttr_of(seen, item["queue"])) if seen is not None else 0,
              "time-left": max(0, int((item["until"] or now) - now)),
              "file": 0, "reserves": counted["reserves"], "timeouts": 0,
              "releases": counted["releases"], "buries": counted["buries"],
              "kicks": counted["kicks"]}
    return with_body("OK", body=yaml_dict(fields))
