"""``blizzard keys ...``: make, rotate and retire the cluster's CURVE keys."""

from __future__ import annotations

import os

import click

from blizzard import keys as k
from blizzard.errors import AuthenticationFailed


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
def rotate(directory: str, name: str) -> None:
    """Give NAME a new pair; the old public key stays valid until `keys retire`.

    Servers pick up the change without a restart. Hand the new secret file to every process
    that uses NAME, restart them one by one, then retire the old key.
    """
    k.rotate(directory, name)
    click.echo(f"new {name} pair in {directory}; the old one is valid until "
               f"`blizzard keys retire {directory} {name}`")


@keys_group.command("retire")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("name", type=click.Choice(k.ROTATING))
def retire(directory: str, name: str) -> None:
    """Stop accepting NAME's old key (new connections with it are refused)."""
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


@keys_group.command("list")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
def list_keys(directory: str) -> None:
    """Every public key the servers would accept, with its role."""
    names = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".key"):
            names[k.load_public(directory, name[:-4])] = name
    for public, role in k.authorized(directory).items():
        click.echo(f"{role:<7} {names.get(public, '?'):<22} {public.decode()}")
