"""The one error tree of Blizzard.

Servers reply with ``Error(code, message)``; the client raises the class whose ``code``
matches, so a caller can catch a precise failure or any ``BlizzardError``.
"""

from __future__ import annotations


class BlizzardError(Exception):
    """Raised for every failure Blizzard reports; the root of the tree."""

    code = "error"

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__doc__ or self.code)
        self.message = message or (self.__doc__ or self.code)


# -- protocol: the bytes on the wire were wrong --------------------------------------------


class ProtocolError(BlizzardError):
    """Raised when a message cannot be decoded or does not match its declared shape."""

    code = "protocol"


class UnknownOp(ProtocolError):
    """Raised when a server receives an op it does not serve."""

    code = "unknown_op"


class VersionMismatch(ProtocolError):
    """Raised when the peer speaks another protocol version."""

    code = "version"

    def __init__(self, message: str = "", peer_version: int | None = None) -> None:
        super().__init__(message)
        self.peer_version = peer_version  # the version the peer's frame named, if known


# -- cluster: a part of the cluster is missing or unreachable -------------------------------


class ClusterError(BlizzardError):
    """Raised when the cluster cannot carry out a well-formed request."""

    code = "cluster"


class MasterUnavailable(ClusterError):
    """Raised when the master does not answer within the client's timeout, or within seconds
    when nothing listens at its address ``addr`` (``refused``: every connection was refused,
    and no master ever answered this client)."""

    code = "master_unavailable"

    def __init__(self, message: str = "", addr: str = "", refused: bool = False) -> None:
        super().__init__(message)
        self.addr = addr
        self.refused = refused


class DatanodeUnavailable(ClusterError):
    """Raised when no data node holding (or placed to hold) an item answers in time."""

    code = "datanode_unavailable"


class WrongNode(ClusterError):
    """Raised by a data node asked to store blobs meant for another node id."""

    code = "wrong_node"


class NotEnoughDatanodes(ClusterError):
    """Raised when fewer live data nodes exist than a write needs."""

    code = "not_enough_datanodes"


class MasterStarting(ClusterError):
    """Raised while a (re)started master waits for data nodes to report; clients retry it."""

    code = "master_starting"


class StorageError(ClusterError):
    """Raised when a server could not make a write durable (disk full, I/O error)."""

    code = "storage"


class DataCorrupt(ClusterError):
    """Raised when every replica of an item answered without a good copy (bad checksum, missing).

    A dequeue raises it when it could read none of the items it leased and each of them is
    damaged or gone on every replica, so asking again will not help (where a replica merely
    did not answer, the error is ``DatanodeUnavailable``). The items are given back with an
    attempt counted; past their queue's ``max_attempts`` they move to its dead-letter queue.
    ``Client.fetch`` does not raise it: it returns the items it could not read.
    """

    code = "data_corrupt"


class NotPrimary(ClusterError):
    """Raised by a master that is not the primary (a standby, or one fenced by a newer epoch).

    Its message names the primary it knows, if any; a client given several master addresses
    moves on to the next one (``blizzard/client/master_link.py``).
    """

    code = "not_primary"


class ForeignCluster(ClusterError):
    """Raised when a master and a data node belong to different clusters (their cluster ids
    differ): the master refuses such a node, and the node does not obey such a master."""

    code = "foreign_cluster"


# -- security: who may talk to the cluster, and what they may do ---------------------------


class SecurityError(BlizzardError):
    """Raised when the cluster's security refuses a connection or a request."""

    code = "security"


class AuthenticationFailed(SecurityError):
    """Raised when a server refuses this process's key (missing, unknown or of the wrong kind),
    or the server is not the one whose public key this process was given."""

    code = "authentication_failed"


class MissingKeys(AuthenticationFailed):
    """Raised when a key directory lacks the files this process needs (or does not exist);
    ``directory`` and ``looked_for`` (the paths tried) let each front end give its advice."""

    code = "missing_keys"

    def __init__(self, message: str = "", directory: str = "",
                 looked_for: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.directory = directory
        self.looked_for = looked_for


class Forbidden(SecurityError):
    """Raised when an authenticated peer asks for something its role or capability does not allow
    (a client key acting as a data node, a forged or expired capability)."""

    code = "forbidden"


# -- request: the request was well formed but cannot be honoured -----------------------------


class RequestError(BlizzardError):
    """Raised when a request is understood but refused."""

    code = "request"


class InvalidArgument(RequestError):
    """Raised when an argument is out of range or of the wrong kind."""

    code = "invalid_argument"


class QueueExists(RequestError):
    """Raised when creating a queue that already exists (change it with ``queue config``)."""

    code = "queue_exists"


class TooManyQueues(RequestError):
    """Raised when a new queue would pass the master's quota for the caller's key (a client
    key's ``client_queues``, everyone's ``max_queues``): reuse or delete a queue."""

    code = "too_many_queues"


class PayloadTooLarge(RequestError):
    """Raised when an item's payload exceeds the cluster's max item size."""

    code = "payload_too_large"


class TooManyItems(RequestError):
    """Raised when one request carries more items than a batch may hold."""

    code = "too_many_items"


class UnknownItem(RequestError):
    """Raised when a request names item ids the master does not hold (e.g. an expired pending
    enqueue)."""

    code = "unknown_item"


class LeaseExpired(RequestError):
    """Raised when a lease was lost (expired, possibly granted to another consumer) before the
    ack."""

    code = "lease_expired"


class WrongLease(LeaseExpired):
    """Raised when an item is leased under another token than the one given: a typo, or a
    lease that ran out (or was nacked) and the item was delivered again since."""

    code = "wrong_lease"


class NotInQueue(RequestError):
    """Raised when an ack names an item that is in another queue than the one given."""

    code = "not_in_queue"


class UnknownQueue(RequestError):
    """Raised when an operation names a queue the master does not hold."""

    code = "unknown_queue"


class InUse(RequestError):
    """Raised when an operator's removal would destroy something still in use (a live data
    node, a leased item, a queue with items) and was not forced."""

    code = "in_use"


# -- the client: a call its own state refuses -------------------------------------------------


class ClientClosed(BlizzardError):
    """Raised by a call made through a ``Client`` after its ``close()`` (a message's ``ack()``
    included): a closed client opens no connection again; make a new one."""

    code = "client_closed"

    def __init__(self, message: str = "this client was closed: make a new one") -> None:
        super().__init__(message)


# What an ack, nack or extend raises for an item it could not settle (``Leases.refusal``): a
# consumer that settles what it leased catches these; each says why in its own words.
NOT_HELD: tuple[type[BlizzardError], ...] = (LeaseExpired, UnknownItem, NotInQueue)

_BY_CODE: dict[str, type[BlizzardError]] = {}


def _register(cls: type[BlizzardError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(BlizzardError)


def from_code(code: str, message: str) -> BlizzardError:
    """Build the exception a server's error reply stands for (unknown codes become the root)."""
    return _BY_CODE.get(code, BlizzardError)(message)
