"""``blizzard status|queue ...``: the state of a running cluster and of its queues."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import click

from blizzard.cli.common import (
    QUEUE_NAME_HELP,
    Seconds,
    keys_opt,
    master_opt,
    queue_arg,
    timeout_opt,
)
from blizzard.cli.output import (
    STATS_KEYS,
    echo_json,
    escape,
    json_opt,
    message_doc,
    output,
    seconds,
    shown_stats,
    size,
    stats_lines,
)
from blizzard.cli.watch import watch, watch_opt
from blizzard.wire.queue_settings import DEAD_SUFFIX, SETTINGS, Setting


@click.command()
@master_opt
@keys_opt
@timeout_opt
@json_opt
@watch_opt
def status(master: str, timeout_s: float, as_json: bool, watch_s: float | None) -> None:
    """Show the cluster id, data nodes (alive, items, bytes) and queues (ready, leased, dead,
    oldest age; a dead item is counted once, in its dead-letter queue's row).

    Queue counts are the master's, exact when shown; a data node's items and bytes are
    those of its last heartbeat, shown with their age ("as of 0.4 s ago").
    Safe mode: the master just started and neither re-replicates nor deletes until the data
    nodes have reported.
    Epoch: how many times a standby took over; standby: the one every confirmation waits for.
    --json: {"cluster_id", "epoch", "standby", "secure", "safe_mode", "replication",
    "under_replicated",
    "nodes": [{"node_id", "addr", "alive", "suspect" (alive, but silent a few heartbeats:
    placed only if need be, read from last), "heartbeat_age_s" (age of items,
    bytes_used and free_bytes), "items", "bytes_used", "free_bytes"}], "queues": [{queue, ready,
    delayed, leased, pending, dead, oldest_age_s, enqueued_total, acked_total (both since the
    master started)}] (the first 1,000 by name), "queues_more" (how many more: `blizzard queue
    list` shows all)}. With --watch, one such document a line ({"error", "error_class"} while the
    master does not answer). A sharded cluster (several masters in --master): the shards' statuses
    merged, with "shards" and "shards_unanswered" ({shard: why}: those down are left out).
    """
    from blizzard.client.core import Client, ShardedClient

    with Client(master, timeout_s=timeout_s) as c:
        def render() -> str:
            st = c.status()
            doc = _status_doc(st)
            if isinstance(c, ShardedClient):  # a sharded cluster: its shards that are down
                doc["shards"] = len(c.shards)
                doc["shards_unanswered"] = {str(k): why for k, why in c.unanswered.items()}
            return json.dumps(doc, indent=None if watch_s else 2) if as_json \
                else "\n".join(_status_lines(st, doc))
        if watch_s is None:
            click.echo(render())
        else:
            watch(render, watch_s, as_json=as_json)


def _status_doc(st: Any) -> dict[str, Any]:
    from blizzard.client.admin import stats_dict

    return {"cluster_id": st.cluster_id, "epoch": st.epoch, "standby": st.standby,
            "secure": st.secure, "safe_mode": st.safe_mode,
            "replication": st.replication,
            "under_replicated": st.under_replicated,
            "nodes": [{"node_id": n.node_id, "addr": n.addr, "alive": n.alive,
                       "suspect": n.suspect, "heartbeat_age_s": round(n.heartbeat_age_s, 3),
                       "items": n.items,
                       "bytes_used": n.bytes_used, "free_bytes": n.free_bytes}
                      for n in st.nodes],
            "queues": [{**shown_stats(stats_dict(q)), "enqueued_total": q.enqueued_total,
                        "acked_total": q.acked_total} for q in st.queues],
            "queues_more": st.queues_more}


def _status_lines(st: Any, doc: dict[str, Any] | None = None) -> list[str]:
    doc = _status_doc(st) if doc is None else doc
    lines = [f"cluster: {st.cluster_id} (epoch {st.epoch}; standby in sync: "
             f"{st.standby or 'none'})"]
    if "shards" in doc:
        down = doc["shards_unanswered"]
        lines.append(f"shards: {doc['shards']}, " + (
            "all answering" if not down else f"NOT ANSWERING: {len(down)} (" + "; ".join(
                f"shard {k}: {why}" for k, why in down.items()) + "); shown: the others"))
    lines += ["security: on (CURVE keys, capabilities)" if st.secure else
              "security: OFF (servers started with --insecure)",
              "safe mode: ON (the master just started: no re-replication or deletion until "
              "the data nodes report)" if st.safe_mode else "safe mode: off",
              f"data nodes (replication {st.replication}, under-replicated items "
              f"{st.under_replicated}; items and bytes as of heartbeats):",
              f"  {'node':<16} {'address':<24} {'state':<7} {'as of':>10} {'items':>9} "
              f"{'used':>10} {'free':>10}"]
    for n in st.nodes:
        state = "DEAD" if not n.alive else "suspect" if n.suspect else "alive"
        lines.append(f"  {n.node_id:<16} {n.addr:<24} {state:<7} "
                     f"{seconds(n.heartbeat_age_s) + ' ago':>10} {n.items:>9} "
                     f"{size(n.bytes_used):>10} {size(n.free_bytes):>10}")
    dead_letters = {q.queue: q.settings.dead_letter or q.queue + DEAD_SUFFIX
                    for q in st.queues if q.dead}
    return [*lines, "queues (exact, as the master holds them now):",
            *_queue_table(doc["queues"], dead_letters, indent="  "),
            *([f"  ... and {st.queues_more} more queues (the first {len(st.queues)} by name are "
               "shown): blizzard queue list"] if st.queues_more else [])]


def _queue_table(rows: list[dict[str, Any]], dead_letters: dict[str, str],
                 indent: str = "") -> list[str]:
    """The queues' counters, each item counted once: a dead item is an item of its
    dead-letter queue (ready, delayed or leased there, as the master holds it), so a queue's
    ``dead`` is shown as a pointer to that row, not as a number to add. ``dead_letters``:
    the dead-letter queue of each queue with dead items."""
    sources: dict[str, list[str]] = {}
    for queue, dead_letter in dead_letters.items():
        sources.setdefault(dead_letter, []).append(queue)

    def dead(q: dict[str, Any]) -> str:
        notes = [f"{q['dead']} (counted in {dead_letters[q['queue']]})"] if q["dead"] else []
        if q["queue"] in sources:
            notes.append(f"(the dead-letter queue of {', '.join(sources[q['queue']])})")
        return " ".join(notes) or "-"
    return [f"{indent}{'queue':<28} {'ready':>9} {'delayed':>9} {'leased':>9} "
            f"{'pending':>9} {'oldest':>9}  dead letters",
            *(f"{indent}{q['queue']:<28} {q['ready']:>9} {q['delayed']:>9} "
              f"{q['leased']:>9} {q['pending']:>9} {seconds(q['oldest_age_s']):>9}  {dead(q)}"
              for q in rows)]


def _setting_option(s: Setting) -> Callable[[Any], Any]:
    """``s`` as a click option (``lease_s`` -> ``--lease-s``), bounds and help included."""
    kind: click.ParamType
    if s.kind is int:
        kind = click.IntRange(int(s.low), int(s.high))
    elif s.kind is float:
        kind = Seconds(s.low, s.high)
    else:
        kind = click.STRING
    default = f" Default: {s.default:g}." if s.kind is not str else ""
    return click.option("--" + s.name.replace("_", "-"), s.name, type=kind,
                        help=s.help + default)


def queue_options(f: Any) -> Any:
    """Add one option per queue setting (``blizzard/wire/queue_settings.py``); unset ones are
    None."""
    for s in reversed(SETTINGS):
        f = _setting_option(s)(f)
    return f


def in_force(name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Queue ``name``'s settings as they act: a default dead-letter queue and burst spelled out."""
    shown = dict(settings)
    if not shown.get("dead_letter"):
        shown["dead_letter"] = name + DEAD_SUFFIX
    rate = shown.get("rate_per_s", 0.0)
    if not shown.get("burst"):
        shown["burst"] = max(1, math.ceil(rate)) if rate > 0 else None  # None: no rate limit
    return shown


def _print_settings(name: str, settings: dict[str, Any], as_json: bool) -> None:
    shown = in_force(name, settings)
    if as_json:
        echo_json({"queue": name, **shown})
        return
    for key, value in shown.items():
        if value is None:
            value = "- (no rate limit)"
        elif key in ("rate_per_s", "max_attempts") and value == 0:
            value = f"{value} (unlimited)"
        click.echo(f"{key}: {value}")


@click.group(help=f"Create, configure and inspect named queues. {QUEUE_NAME_HELP}")
def queue() -> None:
    pass


_SETTINGS_KEYS = "--json: {\"queue\", " + ", ".join(f'"{s.name}"' for s in SETTINGS) + "}."


@queue.command("create", help="Create queue QUEUE with the given settings (error if it "
               f"exists); prints the settings in force. {_SETTINGS_KEYS}")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@queue_options
@json_opt
def queue_create(queue: str, master: str, timeout_s: float, as_json: bool,
                 **options: Any) -> None:
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        settings = c.create_queue(queue, **{k: v for k, v in options.items() if v is not None})
    _print_settings(queue, settings, as_json)


@queue.command("config", help="Show queue QUEUE's settings in force (a dead-letter queue and "
               "burst left at their defaults are spelled out), changing those given (the "
               f"queue is created if new; changes need the admin key). {_SETTINGS_KEYS}")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@queue_options
@json_opt
def queue_config(queue: str, master: str, timeout_s: float, as_json: bool,
                 **options: Any) -> None:
    from blizzard.client.core import Client

    changes = {k: v for k, v in options.items() if v is not None}
    with Client(master, timeout_s=timeout_s, admin=bool(changes)) as c:
        settings = c.configure_queue(queue, **changes) if changes else c.queue_config(queue)
    _print_settings(queue, settings, as_json)


@queue.command("list", help="Every queue with its counters, each item counted once: a dead "
               "item is an item of its dead-letter queue (ready there), and the row of the "
               "queue it died in says how many, in which queue (\"2 (counted in "
               f"jobs.dead)\"). --json: {{\"queues\": [{{{STATS_KEYS}}}]}}; a queue's \"dead\" "
               "counts the items of its dead-letter queue, whose own row counts them too: do not "
               "add the two.")
@master_opt
@keys_opt
@timeout_opt
@json_opt
def queue_list(master: str, timeout_s: float, as_json: bool) -> None:
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        rows = [shown_stats(q) for q in c.queues()]
        dead_letters = {} if as_json else {  # a round trip per queue with dead items
            q["queue"]: in_force(q["queue"], c.queue_config(q["queue"]))["dead_letter"]
            for q in rows if q["dead"]}
    output(as_json, {"queues": rows},
           lambda: click.echo("\n".join(_queue_table(rows, dead_letters))))


@queue.command("stats", help="Queue QUEUE's counters: ready, delayed, leased, pending, dead "
               "(items of it in its dead-letter queue) and the age of the oldest ready item. "
               f"--json: {{{STATS_KEYS}}}. With --tasks, counted by task state instead "
               "(the states `blizzard task` shows): --json: {\"queue\", \"queued\", \"scheduled\", "
               "\"in_flight\", \"succeeded\" (acks since the master started), \"failed\"}.")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@json_opt
@click.option("--tasks", is_flag=True, help="Count by task state: queued, scheduled, in "
              "flight, succeeded, failed.")
def queue_stats(queue: str, master: str, timeout_s: float, as_json: bool, tasks: bool) -> None:
    from blizzard.client.core import Client
    from blizzard.client.http_delivery import task_counts

    with Client(master, timeout_s=timeout_s) as c:
        stats = task_counts(c, queue) if tasks else shown_stats(c.stats(queue))
    lines = [f"{k.replace('_', ' ')}: {v}" for k, v in stats.items()] if tasks else \
        stats_lines(stats)
    output(as_json, stats, lambda: click.echo("\n".join(lines)))


@queue.command("purge")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def queue_purge(queue: str, master: str, timeout_s: float, yes: bool) -> None:
    """Drop every waiting (ready or delayed) item of QUEUE; leased items stay (admin key)."""
    from blizzard.client.core import Client

    if not yes:
        click.confirm(f"Drop every waiting item of queue {queue}?", abort=True)

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        click.echo(f"purged {c.purge(queue)} items")


@queue.command("delete")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@click.option("--force", is_flag=True,
              help="Delete the queue even if it holds items (leased ones too) or items on "
                   "their way in; they go with it.")
def queue_delete(queue: str, master: str, timeout_s: float, force: bool) -> None:
    """Delete QUEUE: its settings and its items (admin key); says how many items went.

    A queue holding items is refused unless --force, and so is one with items on their way
    in (staged and not committed, or an enqueue waiting for its data nodes): forced, their
    commit or enqueue fails. Its dead-letter queue is a queue of its own and stays; delete it
    too if it should go.
    """
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        count = c.delete_queue(queue, force=force)
    click.echo(f"deleted queue {queue} and its {count} items")


@queue.command("peek")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@click.option("--n", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="How many head items to show.")
@json_opt
def queue_peek(queue: str, master: str, timeout_s: float, n: int, as_json: bool) -> None:
    """Show the head items of QUEUE without leasing them (admin key).

    On a dead-letter queue (`jobs.dead`) this is triage: each item's attempts, key and the
    error of its last nack. Text:
    `id=ID<TAB>priority=P<TAB>attempts=A<TAB>key=K<TAB>error=E<TAB>data=DATA`, as `dequeue`
    labels its fields, E and DATA escaped to one line; an @task job shows its call instead,
    `call=always_fails(42)`. --json: {"queue", "items": [{"id", "attempts", "priority",
    "enqueued_at", "key", "error", "size", "data_b64", "data", "call"}]}: "call" is that
    call's text or null (data_b64 is the exact payload either way).
    """
    from blizzard.client.core import Client
    from blizzard.worker.task import format_call

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        msgs = c.peek(queue, n)
    calls = [format_call(m.data) for m in msgs]

    def human() -> None:
        for m, call in zip(msgs, calls, strict=True):
            data = "data=" + escape(m.data) if call is None else "call=" + escape(call.encode())
            click.echo(f"id={m.id}\tpriority={m.priority}\tattempts={m.attempts}\t"
                       f"key={escape(m.key.encode())}\terror={escape(m.error.encode())}\t"
                       f"{data}")
    docs = [{**message_doc(m), "call": call} for m, call in zip(msgs, calls, strict=True)]
    output(as_json, {"queue": queue, "items": docs}, human)


@queue.command("redrive")
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@click.option("--n", default=10000, show_default=True, type=click.IntRange(1, 10000),
              help="How many dead items to move back at most.")
def queue_redrive(queue: str, master: str, timeout_s: float, n: int) -> None:
    """Move dead items of QUEUE (or of dead-letter queue QUEUE) back, attempts reset (admin key)."""
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        click.echo(f"redrove {c.redrive(queue, n)} items")
