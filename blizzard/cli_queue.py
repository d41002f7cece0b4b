"""``blizzard enqueue|dequeue|status|queue ...``: the commands that use a running cluster."""

from __future__ import annotations

import sys
from typing import Any, Callable

import click

from blizzard.cli_common import EXIT_EMPTY, keys_opt, master_opt, timeout_opt
from blizzard.queue_settings import SETTINGS, Setting


@click.command()
@click.argument("queue")
@click.argument("data", nargs=-1, required=True)
@master_opt
@keys_opt
@timeout_opt
@click.option("--priority", default=0, show_default=True, type=int,
              help="Lower is served first; equal priorities are FIFO.")
@click.option("--delay-s", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Keep the items invisible this long (scheduled items).")
@click.option("--key", default=None, help="Items sharing a key are never leased at the same time.")
@click.option("--coalesce", is_flag=True,
              help="With --key: replace waiting items with the same key (latest data kept).")
def enqueue(queue: str, data: tuple[str, ...], master: str, timeout_s: float, priority: int,
            delay_s: float, key: str | None, coalesce: bool) -> None:
    """Add each DATA argument (UTF-8 text) to QUEUE as one item; prints the ids."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        for item_id in c.enqueue_many(queue, [d.encode() for d in data], priority=priority,
                                      delay_s=delay_s, key=key, coalesce=coalesce):
            click.echo(item_id)


@click.command()
@click.argument("queue")
@master_opt
@keys_opt
@timeout_opt
@click.option("--n", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="How many items to take at most.")
@click.option("--ack/--no-ack", default=True, show_default=True,
              help="Acknowledge (delete) the items after printing them; --no-ack leaves them "
                   "leased until the lease ends.")
@click.option("--lease-s", default=None, type=click.FloatRange(0.001),
              help="Lease length; default: the queue's configured lease.")
@click.option("--wait-s", default=0.0, show_default=True, type=click.FloatRange(0, 300),
              help="Wait this long for an item if the queue is empty.")
def dequeue(queue: str, master: str, timeout_s: float, n: int, ack: bool, lease_s: float | None,
            wait_s: float) -> None:
    """Take items from QUEUE and print `id<TAB>data` lines (exit 3 if none)."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        msgs = c.dequeue_many(queue, n, lease_s=lease_s, wait_s=wait_s)
        for m in msgs:
            click.echo(f"{m.id}\t{m.data.decode(errors='backslashreplace')}")
        if msgs and ack:
            c.ack_many(msgs)
    if not msgs:
        click.echo(f"queue {queue!r} is empty", err=True)
        sys.exit(EXIT_EMPTY)


@click.command()
@master_opt
@keys_opt
@timeout_opt
def status(master: str, timeout_s: float) -> None:
    """Show data nodes (alive, items, bytes) and queues (ready, leased)."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        st = c.status()
    click.echo("security: on (CURVE keys, capabilities)" if st.secure else
               "security: OFF (servers started with --insecure)")
    click.echo(f"data nodes (replication {st.replication}, under-replicated items "
               f"{st.under_replicated}):")
    click.echo(f"  {'node':<16} {'address':<24} {'state':<6} {'hb age':>7} {'items':>9} "
               f"{'bytes':>12} {'free':>10}")
    for n in st.nodes:
        click.echo(f"  {n.node_id:<16} {n.addr:<24} {'alive' if n.alive else 'DEAD':<6} "
                   f"{n.heartbeat_age_s:>6.1f}s {n.items:>9} {n.bytes_used:>12} "
                   f"{n.free_bytes // (1 << 20):>8}Mi")
    click.echo("queues:")
    click.echo(f"  {'queue':<24} {'ready':>9} {'delayed':>9} {'leased':>9} {'pending':>9}")
    for q in st.queues:
        click.echo(f"  {q.queue:<24} {q.ready:>9} {q.delayed:>9} {q.leased:>9} {q.pending:>9}")


def _setting_option(s: Setting) -> Callable[[Any], Any]:
    """``s`` as a click option (``lease_s`` -> ``--lease-s``), bounds and help included."""
    kind: click.ParamType
    if s.kind is int:
        kind = click.IntRange(int(s.low), int(s.high))
    elif s.kind is float:
        kind = click.FloatRange(s.low, s.high)
    else:
        kind = click.STRING
    default = f" Default: {s.default:g}." if s.kind is not str else ""
    return click.option("--" + s.name.replace("_", "-"), s.name, type=kind,
                        help=s.help + default)


def queue_options(f: Any) -> Any:
    """Add one option per queue setting (``blizzard/queue_settings.py``); unset ones are None."""
    for s in reversed(SETTINGS):
        f = _setting_option(s)(f)
    return f


def _print_settings(settings: dict[str, Any]) -> None:
    for name, value in settings.items():
        click.echo(f"{name}: {value}")


@click.group()
def queue() -> None:
    """Create, configure and inspect named queues."""


@queue.command("create")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
@queue_options
def queue_create(name: str, master: str, timeout_s: float, **options: Any) -> None:
    """Create queue NAME with the given settings (error if it exists)."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        _print_settings(c.create_queue(name, **{k: v for k, v in options.items() if v is not None}))


@queue.command("config")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
@queue_options
def queue_config(name: str, master: str, timeout_s: float, **options: Any) -> None:
    """Show queue NAME's settings, changing those given (the queue is created if new)."""
    from blizzard.client import Client

    changes = {k: v for k, v in options.items() if v is not None}
    with Client(master, timeout_s=timeout_s, admin=bool(changes)) as c:
        _print_settings(c.configure_queue(name, **changes) if changes else c.queue_config(name))


@queue.command("list")
@master_opt
@keys_opt
@timeout_opt
def queue_list(master: str, timeout_s: float) -> None:
    """Every queue with its counters."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        rows = c.queues()
    click.echo(f"{'queue':<28} {'ready':>9} {'delayed':>9} {'leased':>9} {'dead':>7} {'oldest':>9}")
    for q in rows:
        click.echo(f"{q['queue']:<28} {q['ready']:>9} {q['delayed']:>9} {q['leased']:>9} "
                   f"{q['dead']:>7} {q['oldest_age_s']:>8.1f}s")


@queue.command("stats")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
def queue_stats(name: str, master: str, timeout_s: float) -> None:
    """Queue NAME's counters: ready, delayed, leased, pending, dead, oldest item age."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s) as c:
        _print_settings(c.stats(name))


@queue.command("purge")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
@click.confirmation_option(prompt="Drop every waiting item of this queue?",
                           help="Do not ask for confirmation.")
def queue_purge(name: str, master: str, timeout_s: float) -> None:
    """Drop every waiting (ready or delayed) item of queue NAME; leased items stay."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        click.echo(f"purged {c.purge(name)} items")


@queue.command("peek")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
@click.option("--n", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="How many head items to show.")
def queue_peek(name: str, master: str, timeout_s: float, n: int) -> None:
    """Show the head items of queue NAME without leasing them."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        for m in c.peek(name, n):
            click.echo(f"{m.id}\tpriority={m.priority}\tattempts={m.attempts}\t"
                       f"{m.data.decode(errors='backslashreplace')}")


@queue.command("redrive")
@click.argument("name")
@master_opt
@keys_opt
@timeout_opt
@click.option("--n", default=10000, show_default=True, type=click.IntRange(1, 10000),
              help="How many dead items to move back at most.")
def queue_redrive(name: str, master: str, timeout_s: float, n: int) -> None:
    """Move dead items of queue NAME (or of dead-letter queue NAME) back, attempts reset."""
    from blizzard.client import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        click.echo(f"redrove {c.redrive(name, n)} items")


