"""``blizzard keys ...``: make, rotate and retire the cluster's CURVE keys."""

from __future__ import annotations

import os
import time

import click

from blizzard.net import keys as k
from blizzard.wire.errors import AuthenticationFailed


@click.group("keys")
def keys_group() -> None:
    """The cluster's CURVE keys: one pair each for the master, the data nodes' server side,
    clients and admins, and one per data node (add-node), in one directory (files 0600).
    Servers take --keys DIR, clients keys=DIR or BLIZZARD_KEYS."""


@keys_group.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Replace existing pairs (locks out every process "
              "that uses the old ones).")
def generate(directory: str, force: bool) -> None:
    """Make the master, datanode, client and admin key pairs in DIRECTORY (kept if present)."""
    made = k.generate(directory, force=force)
    click.echo(f"made {', '.join(made)} in {directory}" if made else
               f"every key pair already exists in {directory}")


@keys_group.command("rotate")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("name", type=click.Choice(k.ROTATING))
@click.option("--grace-s", type=click.FloatRange(0, 10 * 365 * 86400, max_open=True),
              default=k.DEFAULT_GRACE_S, show_default=True,
              help="Seconds the old key stays valid unless retired sooner; then servers refuse "
                   "it, on open connections too.")
def rotate(directory: str, name: str, grace_s: float) -> None:
    """Give NAME a new pair; the old public key stays valid until `keys retire`, or until
    the grace period ends.

    Servers pick up the change without a restart. Hand the new secret file to every process
    that uses NAME, restart them one by one, then retire the old key.
    """
    k.rotate(directory, name, grace_s)
    click.echo(f"new {name} pair in {directory}; the old one is valid for {grace_s:g}s, or "
               f"until `blizzard keys retire {directory} {name}`")


@keys_group.command("retire")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("name", type=click.Choice(k.ROTATING))
def retire(directory: str, name: str) -> None:
    """Stop accepting NAME's old key: new connections with it are refused, and requests on
    connections already open with it too (within a second)."""
    if not k.retire(directory, name):
        raise click.ClickException(f"{name} has no old key in {directory}")
    click.echo(f"retired {name}'s old key")


@keys_group.command("add-node")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("name")
def add_node(directory: str, name: str) -> None:
    """Make data node NAME's own key pair (datanode-NAME) in DIRECTORY.

    Copy the pair to that node's machine and start it with --node-key NAME. The master binds
    the key to the node id of its first heartbeat; the key speaks for that node only.
    """
    try:
        made = k.add_node(directory, name)
    except AuthenticationFailed as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"made {made} in {directory}; start the node with --node-key {name}")


@keys_group.command("remove-node")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("name")
def remove_node(directory: str, name: str) -> None:
    """Revoke data node NAME's key: servers refuse it at once, open connections included.

    The other nodes keep working. A replacement node gets a new key (`keys add-node`).
    """
    try:
        found = k.remove_node(directory, name)
    except AuthenticationFailed as exc:
        raise click.ClickException(exc.message) from None
    if not found:
        raise click.ClickException(f"no data node key {name} in {directory}")
    click.echo(f"removed data node key {name}; servers refuse it from now on")


@keys_group.command("export-client")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--name", type=click.Choice(("client", "admin")), default="client",
              show_default=True, help="Whose pair goes along: a producer's or consumer's "
              "(client), or an operator's (admin).")
def export_client(directory: str, out: str, name: str) -> None:
    """Make OUT the key directory a client machine needs: NAME's pair and the master's and
    data nodes' public keys, nothing else (no server secret, no other pair). OUT must be new
    or empty; it is made 0700, its files 0600."""
    try:
        files = k.export_client(directory, out, name)
    except AuthenticationFailed as exc:
        raise click.ClickException(exc.message) from None
    click.echo(f"wrote {', '.join(files)} to {out}; give it to the client as --keys or "
               f"{k.ENV}")


@keys_group.command("list")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
def list_keys(directory: str) -> None:
    """Every public key the servers would accept, with its role."""
    names = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".key"):
            names[k.load_public(directory, name[:-4])] = name
    for public, role in k.authorized(directory).items():
        name = names.get(public, "?")
        until = ""
        if name.endswith(".old.key"):  # a rotated key's old half, valid until its grace ends
            end = k.expiry(os.path.join(directory, name))
            until = "  valid until " + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(end))
        click.echo(f"{role:<7} {name:<22} {public.decode()}{until}")
