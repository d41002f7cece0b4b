"""``blizzard enqueue|dequeue|ack|nack|extend``: put items in, take them out, settle them.

Working from a shell is safe by default: ``dequeue`` leases items and prints each one's id
and lease token; do the work; then ``ack QUEUE ID TOKEN`` (or ``nack`` to give it back,
``extend`` to keep it longer). An item whose lease runs out unacked comes back. Only
``dequeue --ack`` deletes what it prints at once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import click

from blizzard.cli.common import EXIT_EMPTY, Seconds, keys_opt, master_opt, queue_arg, timeout_opt
from blizzard.cli.output import escape, json_opt, message_doc, output, size
from blizzard.wire.limits import (
    MAX_DELAY_S,
    MAX_LEASE_S,
    MAX_LEASE_WAIT_S,
    MIN_LEASE_S,
    PRIORITY_RANGE,
)
from blizzard.wire.protocol import MAX_ITEM_BYTES


@dataclass(frozen=True)
class Held:
    """An item named on the command line by id and lease token (what the lease calls take)."""

    id: int
    lease: int
    queue: str = ""  # an ack naming it is refused for an item of another queue


@click.command()
@queue_arg
@click.argument("data", nargs=-1)
@click.option("--file", "files", multiple=True, type=click.File("rb"),
              help="Enqueue this file's bytes as one item (repeatable; '-' is stdin).")
@master_opt
@keys_opt
@timeout_opt
@click.option("--priority", default=0, show_default=True, type=click.IntRange(*PRIORITY_RANGE),
              help="Lower is served first; equal priorities are FIFO. A 32-bit signed integer.")
@click.option("--delay-s", default=0.0, show_default=True, type=Seconds(0, MAX_DELAY_S),
              help="Keep the items invisible this long (scheduled items); at most a year.")
@click.option("--key", default=None, help="Items sharing a key are never leased at the same time.")
@click.option("--coalesce", is_flag=True,
              help="With --key: replace waiting items with the same key (latest data kept).")
def enqueue(queue: str, data: tuple[str, ...], files: tuple[Any, ...], master: str,
            timeout_s: float, priority: int, delay_s: float, key: str | None,
            coalesce: bool) -> None:
    """Add items to QUEUE and print their ids, one a line.

    Each DATA argument is one item (its UTF-8 text); DATA `-` reads one item from stdin,
    byte for byte (`blizzard enqueue jobs - < job.bin`); each --file PATH is one item. An
    item is at most 16 MiB (a master's --max-item-bytes may allow less): a longer file or
    stdin is refused before anything is sent.
    """
    from blizzard.client.core import Client

    if data.count("-") > 1:
        raise click.UsageError("'-' (stdin) can be given once")
    # click 8.5 types get_binary_stream as an object (it is a function)
    stdin = click.get_binary_stream("stdin")  # type: ignore[operator]
    payloads = [_read_item(stdin, "stdin") if d == "-" else d.encode() for d in data]
    payloads += [_read_item(f, f.name) for f in files]
    if not payloads:
        raise click.UsageError("nothing to enqueue: give DATA, '-' (stdin) or --file PATH")
    with Client(master, timeout_s=timeout_s) as c:
        for item_id in c.enqueue_many(queue, payloads, priority=priority, delay_s=delay_s,
                                      key=key, coalesce=coalesce):
            click.echo(item_id)


def _read_item(stream: Any, name: str) -> bytes:
    """All of ``stream`` as one item, reading no more than the largest item could be (a
    ``--file /dev/zero`` must not fill memory)."""
    data = stream.read(MAX_ITEM_BYTES + 1)
    if len(data) > MAX_ITEM_BYTES:
        raise click.UsageError(f"{name} holds more than {size(MAX_ITEM_BYTES)}, the largest "
                               "item any master accepts (a master's --max-item-bytes, 8 MiB "
                               "by default, may allow less)")
    return data


@click.command()
@queue_arg
@master_opt
@keys_opt
@timeout_opt
@click.option("--n", default=1, show_default=True, type=click.IntRange(1, 10000),
              help="How many items to take at most.")
@click.option("--ack/--no-ack", default=False, show_default=True,
              help="--ack deletes the items right after printing them, so an item is lost if "
                   "its work then fails. The default (--no-ack) leaves them leased and prints "
                   "their lease tokens: ack each with `blizzard ack` once its work is done.")
@click.option("--lease-s", default=None, type=Seconds(MIN_LEASE_S, MAX_LEASE_S),
              help="Lease length; default: the queue's configured lease.")
@click.option("--wait-s", default=0.0, show_default=True, type=Seconds(0, MAX_LEASE_WAIT_S),
              help="Wait this long for an item if the queue is empty.")
@json_opt
def dequeue(queue: str, master: str, timeout_s: float, n: int, ack: bool, lease_s: float | None,
            wait_s: float, as_json: bool) -> None:
    """Lease items from QUEUE and print them with their lease tokens (exit 3 if there were none).

    \b
    Nothing is deleted until it is acked:
      blizzard dequeue jobs --json     # lease, print id, token, data
      ... do the work ...
      blizzard ack jobs ID TOKEN       # or: nack (give back), extend (keep longer)
    An item not acked before its lease ends is delivered again. --ack deletes the items
    as soon as they are printed (it used to be the default: see CHANGELOG.md).

    Text output: one line per item, `id=ID<TAB>token=TOKEN<TAB>data=DATA`, with --ack
    `id=ID<TAB>data=DATA`; DATA escaped to one line (\\t \\n \\r \\\\ and \\xNN for bytes
    that are not UTF-8). --json: {"queue", "acked", "items": [{"id", "token" (unless
    --ack), "attempts", "priority", "enqueued_at" (unix s), "key", "error", "size",
    "data_b64", "data" (the text if UTF-8, else null)}]}.
    """
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        msgs = c.dequeue_many(queue, n, lease_s=lease_s, wait_s=wait_s)

        def human() -> None:
            for m in msgs:
                token = "" if ack else f"token={m.lease}\t"
                click.echo(f"id={m.id}\t{token}data={escape(m.data)}")
            if msgs and not ack and sys.stderr.isatty():
                click.echo(f"leased: when an item is done, `blizzard ack {queue} ID TOKEN`; "
                           "unacked, it comes back when its lease ends", err=True)
        output(as_json, {"queue": queue, "acked": ack and bool(msgs),
                         "items": [message_doc(m, token=not ack) for m in msgs]}, human)
        if msgs and ack:
            c.ack_many(msgs)
    if not msgs:
        click.echo(f"queue {queue!r} is empty", err=True)
        sys.exit(EXIT_EMPTY)


item_args = [click.argument("item_id", metavar="ID", type=click.IntRange(0, 2**63 - 1)),
             click.argument("token", metavar="TOKEN", type=click.IntRange(0, 2**63 - 1))]


def _item_command(f: Any) -> Any:
    for decorate in reversed([queue_arg, *item_args, master_opt, keys_opt, timeout_opt]):
        f = decorate(f)
    return click.command()(f)


@_item_command
def ack(queue: str, item_id: int, token: int, master: str, timeout_s: float) -> None:
    """Finish item ID of QUEUE, leased with lease TOKEN (from `dequeue`): it is deleted.

    Prints `acked ID` only once the master has durably deleted it. Otherwise it changes
    nothing and fails (exit 1) saying why: UnknownItem (no item has that id), NotInQueue
    (the item is in another queue), WrongLease (the item is leased under another token:
    a wrong token, or your lease ran out and it was delivered again), LeaseExpired (the
    lease ran out and the item is back in its queue, or it was already settled).
    """
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        c.ack_many([Held(item_id, token, queue)])
    click.echo(f"acked {item_id}")


@_item_command
@click.option("--delay-s", default=None, type=Seconds(0, MAX_DELAY_S),
              help="Visible again after this long; default: the queue's retry back-off.")
@click.option("--error", default="", help="Why it failed: kept with the item and shown by "
              "`queue peek` if it ends up in the dead-letter queue.")
def nack(queue: str, item_id: int, token: int, master: str, timeout_s: float,
         delay_s: float | None, error: str) -> None:
    """Give item ID of QUEUE (lease TOKEN) back: it is delivered again, counting an attempt."""
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        c.nack_many([Held(item_id, token, queue)], delay_s=delay_s, error=error)
    click.echo(f"nacked {item_id}")


@_item_command
@click.option("--lease-s", required=True, type=Seconds(MIN_LEASE_S, MAX_LEASE_S),
              help="Keep the lease this many seconds from now.")
def extend(queue: str, item_id: int, token: int, master: str, timeout_s: float,
           lease_s: float) -> None:
    """Keep the lease TOKEN on item ID of QUEUE for --lease-s more seconds (a long job)."""
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s) as c:
        c.extend_many([Held(item_id, token, queue)], lease_s=lease_s)
    click.echo(f"extended {item_id} by {lease_s:g} s")
