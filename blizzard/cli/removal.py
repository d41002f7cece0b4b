"""``blizzard delete|node remove``: an operator removes an item or a dead data node for good.

Both need the admin key. (``blizzard queue delete`` lives with the other queue commands.)
"""

from __future__ import annotations

import click

from blizzard.cli.common import keys_opt, master_opt, queue_arg, timeout_opt


@click.command()
@queue_arg
@click.argument("item_id", metavar="ID", type=click.IntRange(0, 2**63 - 1))
@master_opt
@keys_opt
@timeout_opt
@click.option("--force", is_flag=True,
              help="Delete the item even if it is leased (a consumer may be working on it).")
def delete(queue: str, item_id: int, master: str, timeout_s: float, force: bool) -> None:
    """Delete item ID of QUEUE for good: ready, delayed or dead (admin key).

    A dead item is named by its dead-letter queue (`jobs.dead`) or by the queue it died in.
    A leased item is refused unless --force; an id QUEUE does not hold is an error.
    """
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        c.delete(queue, item_id, force=force)
    click.echo(f"deleted item {item_id} of {queue}")


@click.group()
def node() -> None:
    """Manage the cluster's data nodes."""


@node.command("remove")
@click.argument("node_id", metavar="ID")
@master_opt
@keys_opt
@timeout_opt
def node_remove(node_id: str, master: str, timeout_s: float) -> None:
    """Forget the dead data node ID (`blizzard status` lists node ids; admin key).

    Its replicas drop out and the items it held are copied again from their other replicas,
    as for any dead node; status no longer lists it. A live node is refused (stop it first),
    and so is a node holding an item's only replica. If the node comes back later it joins
    as a new one: blobs it still holds are kept where an item needs them, else deleted.
    """
    from blizzard.client.core import Client

    with Client(master, timeout_s=timeout_s, admin=True) as c:
        held = c.remove_node(node_id)
    click.echo(f"removed data node {node_id}; {held} items had a replica there and are "
               "copied again from their other replicas")
