"""CURVE key pairs: making them, loading them, and who each public key speaks for.

A key directory (``blizzard keys generate DIR``) holds one key pair per party, in ZeroMQ's
certificate format (``NAME.key`` public, ``NAME.key_secret`` public and secret), every file
mode 0600:

========== ===================================================================
``master``   the master's server key; clients and data nodes pin its public key
``datanode`` the data nodes' server key (clients pin its public key); no role: it lets
             nobody in
``datanode-NAME`` one data node's own key, towards the master and the other nodes (role
             ``node``); ``blizzard keys add-node DIR NAME`` makes one, ``remove-node``
             revokes it alone. The master binds it to the node id that first heartbeats
             with it (``master/nodes/node_keys.py``)
``client``   producers and consumers (role ``client``)
``admin``    operators: purge, redrive, configure, deletes, node removal (role ``admin``)
========== ===================================================================

A server accepts every public key in the directory whose file name starts with a role's
prefix (``datanode*.key``, ``client*.key``, ``admin*.key``), re-reading the directory when it
changes. So a key rotates without a restart: ``blizzard keys rotate DIR client`` keeps the old
public key valid as ``client.old.key`` next to the new pair, and ``blizzard keys retire DIR
client`` drops it once every process uses the new one; unretired, it expires when its grace
period ends (``rotate --grace-s``, a day by default; the end is in ``client.old.expires``).
A key that is retired, expired or removed is refused on connections already open with it
too (``secure._Directory.current``), within a second.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.auth

from blizzard.wire.errors import AuthenticationFailed, MissingKeys

log = logging.getLogger(__name__)

PARTIES = ("master", "datanode", "client", "admin")
ROLE_OF_PREFIX = {"datanode-": "node", "client": "client", "admin": "admin",
                  "master": "master"}  # a standby master follows its primary with this pair
NODE_PREFIX = "datanode-"  # a data node's own pair: ``datanode-NAME``
NODE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ROTATING = ("client", "admin")  # the datanode and master pairs are server keys others pin
ZAP_DOMAIN = "blizzard"
# a socket whose ZAP domain is ``blizzard:ROLE,ROLE`` admits only keys of those roles (a
# sharded master's heads feed: what producers and consumers read, not data nodes)
READERS = ("admin", "client")
ENV = "BLIZZARD_KEYS"
# How long a rotated key's old half stays valid unless retired sooner (``rotate --grace-s``).
DEFAULT_GRACE_S = 24 * 3600.0


def _private(path: str) -> None:
    os.chmod(path, 0o600)


def _new_pair(directory: str, name: str) -> None:
    public, secret = zmq.auth.create_certificates(directory, name)
    _private(public)
    _private(secret)


def generate(directory: str, *, force: bool = False) -> list[str]:
    """Make the four key pairs in ``directory`` (created 0700); the names of those made.

    Existing pairs are kept unless ``force``: running it twice never locks anyone out.
    """
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    made = []
    for name in PARTIES:
        if force or not os.path.exists(os.path.join(directory, name + ".key_secret")):
            _new_pair(directory, name)
            made.append(name)
    return made


def rotate(directory: str, name: str, grace_s: float = DEFAULT_GRACE_S) -> None:
    """Replace ``name``'s pair; its old public key stays valid (``NAME.old.key``) until retired,
    or until ``grace_s`` seconds have passed (the end is kept in ``NAME.old.expires``)."""
    if not 0 <= grace_s < 10 * 365 * 86400:
        raise AuthenticationFailed("the grace period is between 0 and 10 years, in seconds")
    if name not in ROTATING:
        raise AuthenticationFailed(f"only {' and '.join(ROTATING)} keys rotate live; a server "
                                   "key (master, datanode) changes with a restart of the "
                                   "servers and of every process that pins it")
    base = os.path.join(directory, name)
    if os.path.exists(base + ".old.key"):
        raise AuthenticationFailed(f"{name} is already rotating: retire the old key first")
    os.replace(base + ".key", base + ".old.key")
    os.replace(base + ".key_secret", base + ".old.key_secret")
    with open(os.open(base + ".old.expires", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
              "w") as f:
        f.write(f"{time.time() + grace_s:.3f}\n")
    _new_pair(directory, name)
    os.utime(directory)  # servers notice the change by the directory's time


def retire(directory: str, name: str) -> bool:
    """Drop ``name``'s old key after a rotation; False if there was none."""
    base = os.path.join(directory, name)
    found = False
    for path in (base + ".old.key", base + ".old.key_secret", base + ".old.expires"):
        if os.path.exists(path):
            os.remove(path)
            found = found or path.endswith(".key")
    os.utime(directory)
    return found


def expiry(old_key_path: str) -> float:
    """When a rotated key's old half (``NAME.old.key``) stops being valid (unix time): as its
    ``NAME.old.expires`` says, or for one rotated before expiries were kept, the default grace
    after the rotation (the file's change time).

    ``OSError`` when either file cannot be read for another reason than being absent (no
    descriptor left, no permission): guessing then could bring an expired key back."""
    try:
        with open(old_key_path[:-len(".key")] + ".expires") as f:
            return float(f.read().strip())
    except (FileNotFoundError, ValueError):
        return os.stat(old_key_path).st_ctime + DEFAULT_GRACE_S


def key_files(directory: str, suffix: str = ".key") -> list[str]:
    """The paths of the directory's files ending in ``suffix``, sorted. Unlike ``glob``,
    which answers [] for a directory it cannot open, ``OSError`` when the directory cannot
    be listed (no descriptor left, no permission): "no keys" must never be a guess."""
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.endswith(suffix))


def next_expiry(directory: str) -> float:
    """The soonest end of an old key's grace still to come (inf: none); ``OSError`` as
    ``key_files``."""
    now = time.time()
    ends = []
    for path in key_files(directory, ".old.key"):
        try:
            ends.append(expiry(path))
        except FileNotFoundError:  # retired meanwhile
            continue
    return min((end for end in ends if end > now), default=float("inf"))


def _node_base(directory: str, name: str) -> str:
    if not NODE_NAME.fullmatch(name):
        raise AuthenticationFailed(f"a data node key's name is 1-64 letters, digits, '_' or "
                                   f"'-', not {name[:80]!r}")
    return os.path.join(directory, NODE_PREFIX + name)


def add_node(directory: str, name: str) -> str:
    """Make data node ``name``'s own pair (``datanode-NAME``); its file base name."""
    base = _node_base(directory, name)
    if os.path.exists(base + ".key_secret") or os.path.exists(base + ".key"):
        raise AuthenticationFailed(f"data node key {name} exists in {directory}; remove it "
                                   "first (`blizzard keys remove-node`) to replace it")
    if not os.path.isdir(directory):
        raise AuthenticationFailed(f"no key directory {directory}: make it with `blizzard "
                                   "keys generate DIR`")
    _new_pair(directory, NODE_PREFIX + name)
    os.utime(directory)  # servers notice the change by the directory's time
    return NODE_PREFIX + name


def remove_node(directory: str, name: str) -> bool:
    """Revoke data node ``name``'s key: servers refuse it from now on and close its open
    connections; False if there was none."""
    base = _node_base(directory, name)
    found = False
    for path in (base + ".key", base + ".key_secret"):
        if os.path.exists(path):
            os.remove(path)
            found = True
    os.utime(directory)
    return found


def node_names(directory: str) -> list[str]:
    """The data node keys in ``directory`` that have their secret half (``NAME`` only)."""
    found = glob.glob(os.path.join(glob.escape(directory), NODE_PREFIX + "*.key_secret"))
    return sorted(os.path.basename(path)[len(NODE_PREFIX):-len(".key_secret")]
                  for path in found)


def missing_advice(directory: str, looked_for: Sequence[str], *, cli: bool) -> str:
    """What to say when the files ``looked_for`` are not in the key directory ``directory``,
    in the command line's words (``--keys DIR``) or Python's (``keys=DIR``). Never "make
    keys": new keys suit a new cluster only, and a running one admits none of them."""
    files = " and ".join(looked_for)
    if os.path.isdir(directory):
        head = f"{directory} is not a key directory (looked for {files})"
    else:
        why = "it is a file" if os.path.exists(directory) else "it does not exist"
        head = f"no key directory {directory} ({why}; looked for {files})"
    inner = os.path.join(directory, "keys")
    if os.path.isdir(inner):  # a cluster's data directory (``blizzard cluster`` keeps them there)
        given = f"--keys {inner}" if cli else f"keys={inner!r}"
        return f"{head}; a cluster's data directory keeps its keys in {inner}: pass {given}"
    given = f"--keys DIR (or {ENV}=DIR)" if cli else f"keys=DIR (or set {ENV})"
    return (f"{head}; pass {given} naming the key directory the cluster runs with (`blizzard "
            f"cluster --data-dir D` keeps it in D/keys and prints it as {ENV}); `blizzard keys "
            "generate DIR` makes keys for a new cluster only: a running one admits none of them")


def require(directory: str, *needs: tuple[str, ...]) -> None:
    """``MissingKeys`` unless ``directory`` holds, for each need, one of its file names."""
    missing = [os.path.join(directory, names[0]) for names in needs
               if not any(os.path.exists(os.path.join(directory, n)) for n in names)]
    if missing:
        raise MissingKeys(missing_advice(directory, missing, cli=False), directory,
                          tuple(missing))


def load_pair(directory: str, name: str) -> tuple[bytes, bytes]:
    """``name``'s (public, secret) key, z85; ``MissingKeys`` naming the missing file."""
    path = os.path.join(directory, name + ".key_secret")
    require(directory, (name + ".key_secret",))
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise AuthenticationFailed(f"unreadable key file {path}: {exc}") from None
    if secret is None:
        raise AuthenticationFailed(f"{path} holds no secret key")
    return public, secret


def load_public(directory: str, name: str) -> bytes:
    """``name``'s public key, z85 (from ``NAME.key``, or the pair file if only that is there)."""
    for path in (os.path.join(directory, name + ".key"),
                 os.path.join(directory, name + ".key_secret")):
        if os.path.exists(path):
            try:
                return zmq.auth.load_certificate(path)[0]
            except (OSError, ValueError) as exc:
                raise AuthenticationFailed(f"unreadable key file {path}: {exc}") from None
    path = os.path.join(directory, name + ".key")
    raise MissingKeys(missing_advice(directory, [path], cli=False), directory, (path,))


def authorized(directory: str) -> dict[bytes, str]:
    """Every public key (z85) the directory lets in, with its role (not an old key whose
    grace period has ended).

    A key is left out only when the directory was read and its file is gone or holds no key
    (a file half-written: it is read again when the directory changes). Anything else that
    stops a file or the directory being read (no descriptor left, no permission) raises
    ``OSError``: a server must then keep the keys it had, never take "none" for the answer
    (it would revoke every open connection)."""
    keys: dict[bytes, str] = {}
    now = time.time()
    for path in key_files(directory):
        name = os.path.basename(path)
        role = next((role for prefix, role in ROLE_OF_PREFIX.items()
                     if name.startswith(prefix)), None)
        if role is None:
            continue
        try:
            if name.endswith(".old.key") and expiry(path) <= now:
                continue
            keys[zmq.auth.load_certificate(path)[0]] = role
        except FileNotFoundError:
            continue  # removed since the listing: truly gone
        except ValueError:
            log.warning("%s holds no public key (half-written?): left out until the key "
                        "directory changes", path)
            continue
    return keys


@dataclass(frozen=True)
class ClientKeys:
    """What a connecting process needs: its own pair and the servers' public keys (all z85).

    ``datanode`` may be None: the client then asks the master for it.
    """

    public: bytes
    secret: bytes
    master: bytes
    datanode: bytes | None = None

    @classmethod
    def from_dir(cls, directory: str, name: str = "client") -> ClientKeys:
        require(directory, (name + ".key_secret",), ("master.key", "master.key_secret"))
        public, secret = load_pair(directory, name)
        datanode = None
        if os.path.exists(os.path.join(directory, "datanode.key")):
            datanode = load_public(directory, "datanode")
        return cls(public, secret, load_public(directory, "master"), datanode)


@dataclass(frozen=True)
class ServerKeys:
    """A server's own pair and the directory of keys it lets in."""

    public: bytes
    secret: bytes
    directory: str

    @classmethod
    def from_dir(cls, directory: str, name: str) -> ServerKeys:
        check_private(directory)
        public, secret = load_pair(directory, name)
        return cls(public, secret, directory)


def check_private(directory: str) -> None:
    """``AuthenticationFailed`` (one line, with the fix) if other users may read a secret key
    of the directory, or change the directory or a key in it (add a key of their own, swap
    one); a loud warning if they may list it. What a server checks as it starts."""
    try:
        mode = stat.S_IMODE(os.stat(directory).st_mode)
    except OSError:
        return  # a missing directory is reported by the key loading, with its advice
    if mode & 0o022:
        raise AuthenticationFailed(f"the key directory {directory} is writable by other users "
                                   f"(mode {mode:o}), who could add keys: chmod 700 {directory}")
    for path in sorted(glob.glob(os.path.join(glob.escape(directory), "*.key*"))):
        file_mode = stat.S_IMODE(os.stat(path).st_mode)
        loose = 0o077 if path.endswith("_secret") else 0o022
        if file_mode & loose:
            raise AuthenticationFailed(f"{path} is {'readable' if loose == 0o077 else 'writable'}"
                                       f" by other users (mode {file_mode:o}): chmod 600 {path}")
    if mode & 0o055:
        log.warning("the key directory %s may be listed by other users (mode %o): chmod 700 %s",
                    directory, mode, directory)


def export_client(directory: str, out: str, name: str = "client") -> list[str]:
    """Make ``out`` (0700, new or empty) the key directory of a client machine: ``name``'s
    pair and the servers' public keys, nothing else; the files written.

    ``out`` must be the caller's own: an existing one that another user owns, that others
    may write, or that is a symbolic link is refused (whoever controls it could read the
    secret written there, or redirect it), and each file is made new in it, never through a
    link (``O_EXCL | O_NOFOLLOW``, relative to the directory opened once)."""
    if name not in ("client", "admin"):
        raise AuthenticationFailed(f"a client machine's directory holds a client or admin "
                                   f"pair, not {name!r}")
    load_pair(directory, name)  # a readable pair, or the reason why not
    files = [name + ".key", name + ".key_secret", "master.key", "datanode.key"]
    for file in files[2:]:
        load_public(directory, file[:-len(".key")])
        if not os.path.exists(os.path.join(directory, file)):
            raise AuthenticationFailed(f"no {file} in {directory} to export")
    try:
        os.makedirs(out, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise AuthenticationFailed(f"cannot make {out}: {exc.strerror or exc}") from None
    try:
        dir_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise AuthenticationFailed(f"{out} is not a directory of its own (a symbolic link, or "
                                   f"a file?): {exc.strerror or exc}; choose a new one") from None
    try:
        st = os.fstat(dir_fd)
        if st.st_uid != os.geteuid():
            raise AuthenticationFailed(f"{out} belongs to another user (uid {st.st_uid}), who "
                                       "could read the secret key: choose a directory of your own")
        if stat.S_IMODE(st.st_mode) & 0o022:
            raise AuthenticationFailed(f"{out} may be written by other users (mode "
                                       f"{stat.S_IMODE(st.st_mode):o}): choose a directory of "
                                       "your own")
        if os.listdir(dir_fd):
            raise AuthenticationFailed(f"{out} exists and is not an empty directory: choose a "
                                       "new one (nothing is overwritten)")
        os.fchmod(dir_fd, 0o700)
        for file in files:  # the files as they are: ZeroMQ's certificate format
            with open(os.path.join(directory, file), "rb") as src:
                data = src.read()
            fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                         dir_fd=dir_fd)
            with open(fd, "wb") as dst:
                dst.write(data)
    except FileExistsError as exc:  # made meanwhile by someone else
        raise AuthenticationFailed(f"{exc.filename} appeared in {out} while exporting: "
                                   "choose a new directory") from None
    finally:
        os.close(dir_fd)
    return sorted(files)


def node_keys(directory: str, name: str | None = None) -> tuple[ServerKeys, ClientKeys]:
    """A data node's keys: its server side (the shared ``datanode`` pair clients pin), and
    its own pair ``datanode-NAME`` towards the master and other nodes. Without ``name``, the
    only node pair in the directory (a node machine's directory holds its own alone)."""
    server = ServerKeys.from_dir(directory, "datanode")
    if name is None:
        names = node_names(directory)
        if len(names) != 1:
            raise AuthenticationFailed(
                f"{'no data node key' if not names else 'several data node keys'} in "
                f"{directory}: " + ("make this node's own with `blizzard keys add-node DIR "
                                    "NAME` (the shared datanode key no longer speaks for a node)"
                                    if not names else f"choose one with --node-key NAME "
                                    f"({', '.join(names[:5])})"))
        name = names[0]
    _node_base(directory, name)  # a name that is no file name is refused here
    public, secret = load_pair(directory, NODE_PREFIX + name)
    return server, ClientKeys(public, secret, load_public(directory, "master"), server.public)


def master_keys(directory: str) -> tuple[ServerKeys, ClientKeys]:
    """A master's keys: its server side, and its side towards the primary it follows as a
    standby (the same pair: a standby is a master)."""
    server = ServerKeys.from_dir(directory, "master")
    return server, ClientKeys(server.public, server.secret, server.public,
                              load_public(directory, "datanode"))


def resolve(keys: str | ClientKeys | None, name: str = "client") -> ClientKeys | None:
    """A client's keys from a directory, given keys, or ``BLIZZARD_KEYS``; None: insecure."""
    if isinstance(keys, ClientKeys):
        return keys
    directory = keys if keys is not None else os.environ.get(ENV) or None
    return ClientKeys.from_dir(directory, name) if directory else None
