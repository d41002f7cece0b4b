"""The SQS actions, each over a Blizzard client: what ``blizzard sqs`` does for a request.

Each action takes the request's parameters (the JSON protocol's shape, ``sqs_wire``) and a
``Caller`` (the client of the caller's role, the URL prefix the caller reached the gateway
by) and returns the result in the JSON protocol's shape, or raises ``SqsError``.

What maps to what (docs/sqs.md has the whole table): a queue is the Blizzard queue of the
same name; SendMessage is an enqueue (answered once the master's WAL and W data nodes hold
it); ReceiveMessage leases up to 10 items for the visibility timeout; DeleteMessage acks
(durable before the reply); ChangeMessageVisibility extends the lease (0: gives the item
back); a FIFO queue's MessageGroupId is the item's key, so a group has one message in
flight at a time, in order; a RedrivePolicy is the queue's dead-letter queue and
max_attempts; StartMessageMoveTask redrives the dead-letter queue's items to their queues.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blizzard.client.enqueue_options import EnqueueOptions
from blizzard.gateways import sqs_messages as msgs
from blizzard.gateways import sqs_queues as queues
from blizzard.gateways.sqs_queues import ACCOUNT, QueueInfo
from blizzard.gateways.sqs_wire import SqsError, invalid, nonexistent, text, texts
from blizzard.wire.errors import (
    Forbidden,
    InvalidArgument,
    LeaseExpired,
    NotInQueue,
    QueueExists,
    TooManyItems,
    UnknownItem,
    UnknownQueue,
    WrongLease,
)
from blizzard.wire.limits import MIN_LEASE_S

CACHE_S = 2.0  # how long a queue's attributes are taken as read (other gateways may change them)
MAX_BATCH = 10
MAX_WAIT_S = 20
DEDUP_S = 300.0  # SQS's deduplication interval: five minutes
READ_S = 10.0  # a receive with visibility 0 leases this long to read its items, then gives back
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_GROUP_ID = re.compile(r"[!-~]{1,128}")  # printable ASCII, as SQS takes
GONE = (LeaseExpired, WrongLease, UnknownItem, NotInQueue)  # a handle whose delivery is over
ADMIN_ACTIONS = {"DeleteQueue", "PurgeQueue", "SetQueueAttributes", "StartMessageMoveTask",
                 "TagQueue", "UntagQueue"}


@dataclass
class Caller:
    client: Any  # a Blizzard Client speaking with the key of ``role``
    role: str  # "client" or "admin"
    base: str  # "http://host:port": the gateway as the caller reached it (queue URLs start so)
    batcher: Any = None  # sends and deletes with other connections' (``gateways/batcher.py``)
    binary_base64: bool = True  # binary attribute values travel base64-encoded


class QueueCache:
    """Queues' attributes as last read, for ``CACHE_S``: a send or receive need not ask the
    master every time. A change made through this gateway drops the entry at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, tuple[float, QueueInfo]] = {}

    def get(self, client: Any, name: str, fresh: bool = False) -> QueueInfo:
        now = time.monotonic()
        with self.lock:
            hit = self.entries.get(name)
        if hit is not None and not fresh and now - hit[0] < CACHE_S:
            return hit[1]
        info = queues.info_of(client.admin.describe(name))
        with self.lock:
            if len(self.entries) > 10_000:
                self.entries.clear()
            self.entries[name] = (now, info)
        return info

    def drop(self, name: str) -> None:
        with self.lock:
            self.entries.pop(name, None)


class Actions:
    """The SQS actions over the cluster."""

    def __init__(self, receipts: msgs.Receipts, region: str = "us-east-1") -> None:
        self.receipts = receipts
        self.region = region
        self.cache = QueueCache()
        self.table: dict[str, Callable[[dict[str, Any], Caller], dict[str, Any]]] = {
            "CreateQueue": self.create_queue, "GetQueueUrl": self.get_queue_url,
            "ListQueues": self.list_queues, "DeleteQueue": self.delete_queue,
            "GetQueueAttributes": self.get_queue_attributes,
            "SetQueueAttributes": self.set_queue_attributes, "PurgeQueue": self.purge_queue,
            "SendMessage": self.send_message, "SendMessageBatch": self.send_message_batch,
            "ReceiveMessage": self.receive_message, "DeleteMessage": self.delete_message,
            "DeleteMessageBatch": self.delete_message_batch,
            "ChangeMessageVisibility": self.change_message_visibility,
            "ChangeMessageVisibilityBatch": self.change_message_visibility_batch,
            "ListDeadLetterSourceQueues": self.list_dead_letter_source_queues,
            "StartMessageMoveTask": self.start_message_move_task,
            "TagQueue": self.tag_queue, "UntagQueue": self.untag_queue,
            "ListQueueTags": self.list_queue_tags,
            "ListMessageMoveTasks": self.list_message_move_tasks,
            "CancelMessageMoveTask": self.cancel_message_move_task,
        }

    def run(self, action: str, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        do = self.table.get(action)
        if do is None:
            if action in ("AddPermission", "RemovePermission"):
                raise SqsError("AWS.SimpleQueueService.UnsupportedOperation",
                               f"{action}: access is decided by the gateway's --credentials "
                               "roles (client, admin)")
            raise SqsError("InvalidAction", f"The action {action} is not valid for this "
                                            "endpoint.")
        if action in ADMIN_ACTIONS and caller.role != "admin":
            raise SqsError("AccessDenied", f"{action} needs an access key of the admin role")
        try:
            return do(params, caller)
        except UnknownQueue:  # deleted meanwhile (this gateway's view was up to 2 s old)
            self.cache.drop(queues.name_of_url(params.get("QueueUrl")))
            raise nonexistent(str(params.get("QueueUrl"))) from None
        except TooManyItems as exc:
            raise SqsError("RequestThrottled", f"the cluster refused for now: {exc}") from None
        except Forbidden as exc:
            hint = " (start the gateway with --admin for admin actions)" \
                if action in ADMIN_ACTIONS or action == "CreateQueue" else ""
            raise SqsError("AccessDenied", f"the cluster refused: {exc}{hint}") from None
        except InvalidArgument as exc:
            raise invalid(str(exc)) from None

    # -- names -----------------------------------------------------------------------------

    def url(self, caller: Caller, name: str) -> str:
        return f"{caller.base}/{ACCOUNT}/{name}"

    def arn(self, name: str) -> str:
        return f"arn:aws:sqs:{self.region}:{ACCOUNT}:{name}"

    def _queue(self, params: dict[str, Any], caller: Caller, fresh: bool = False) -> QueueInfo:
        name = queues.name_of_url(params.get("QueueUrl"))
        info = self.cache.get(caller.client, name, fresh)
        if not info.exists:
            raise nonexistent(params["QueueUrl"])
        return info

    # -- queues ----------------------------------------------------------------------------

    def create_queue(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        name = queues.check_name(params.get("QueueName"))
        fifo = name.endswith(".fifo")
        given = params.get("Attributes") or {}
        attrs = queues.check_attributes(given, fifo, creating=True)
        if fifo and given.get("FifoQueue") != "true" and "FifoQueue" not in given:
            raise invalid("The name of a FIFO queue ends with .fifo and its attribute "
                          "FifoQueue is true: set FifoQueue to true")
        tags = queues.check_tags(params.get("tags", params.get("Tags", {})))
        if "RedrivePolicy" in attrs and caller.role != "admin":
            raise SqsError("AccessDenied", "a RedrivePolicy needs an access key of the admin "
                                           "role")
        settings = queues.settings_of(attrs)
        if settings.get("dead_letter"):
            self._check_dead_letter(caller, settings["dead_letter"], fifo)
        info = self.cache.get(caller.client, name, fresh=True)
        if not info.exists:
            settings.setdefault("max_attempts", 0)  # no RedrivePolicy: never dead-lettered
            text = queues.kept_text(queues.kept_of(attrs), tags, int(time.time()))
            try:
                caller.client.create_queue(name, attributes=text, **settings)
            except QueueExists:
                pass  # made meanwhile: compared below
            self.cache.drop(name)
            info = self.cache.get(caller.client, name, fresh=True)
        current = queues.reported(info, self.arn(name))
        for key, value in attrs.items():
            if not queues.same_value(key, current.get(key, ""), value):
                raise SqsError("QueueAlreadyExists",
                               f"A queue already exists with the same name and a different "
                               f"value for attribute {key}")
        return {"QueueUrl": self.url(caller, name)}

    def _check_dead_letter(self, caller: Caller, target: str, fifo: bool) -> None:
        dead = self.cache.get(caller.client, target, fresh=True)
        if not dead.exists:
            raise invalid(f"Value for parameter RedrivePolicy is invalid. Reason: Dead letter "
                          f"target does not exist: {target}")
        if dead.fifo != fifo:
            raise invalid("Value for parameter RedrivePolicy is invalid. Reason: a FIFO queue's "
                          "dead-letter queue is a FIFO queue, a standard queue's a standard one")

    def get_queue_url(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        name = params.get("QueueName")
        if not isinstance(name, str) or not name:
            raise SqsError("MissingParameter", "The request must contain the parameter "
                                               "QueueName.")
        if "/" in name:
            raise nonexistent(name)
        self._queue({"QueueUrl": name}, caller, fresh=True)
        return {"QueueUrl": self.url(caller, name)}

    def list_queues(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        prefix = text(params.get("QueueNamePrefix", ""), "QueueNamePrefix")
        limit = params.get("MaxResults")
        if limit is not None and (type(limit) is not int or not 1 <= limit <= 1000):
            raise invalid("MaxResults must be an integer from 1 to 1000")
        after = _untoken(params.get("NextToken"))
        names = sorted(q.queue for q in caller.client.admin.describe_all()
                       if q.queue.startswith(prefix) and q.queue > after)
        if limit is None:
            names = names[:1000]
            return {"QueueUrls": [self.url(caller, n) for n in names]} if names else {}
        out: dict[str, Any] = {"QueueUrls": [self.url(caller, n) for n in names[:limit]]}
        if len(names) > limit:
            out["NextToken"] = base64.urlsafe_b64encode(names[limit - 1].encode()).decode()
        return out

    def delete_queue(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        caller.client.delete_queue(info.name, force=True)
        self.cache.drop(info.name)
        return {}

    def get_queue_attributes(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        names = texts(params.get("AttributeNames"), "AttributeNames")
        every = queues.reported(info, self.arn(info.name))
        for n in names:
            if n != "All" and n not in every and n not in queues.SETTABLE | queues.READ_ONLY:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {n}.")
        chosen = every if "All" in names else {n: every[n] for n in names if n in every}
        return {"Attributes": chosen} if chosen else {}

    def set_queue_attributes(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        attrs = queues.check_attributes(params.get("Attributes") or {}, info.fifo,
                                        creating=False)
        settings = queues.settings_of(attrs)
        if settings.get("dead_letter"):
            self._check_dead_letter(caller, settings["dead_letter"], info.fifo)
        kept = dict(info.attrs) | queues.kept_of(attrs)
        if kept.get("RedrivePolicy") == "":
            del kept["RedrivePolicy"]
        text = queues.kept_text(kept, info.tags, info.created or int(time.time()))
        caller.client.configure_queue(info.name, attributes=text, **settings)
        self.cache.drop(info.name)
        return {}

    def purge_queue(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller)
        caller.client.purge(info.name)
        return {}

    def tag_queue(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        tags = queues.check_tags(params.get("Tags"))
        merged = info.tags | tags
        if len(merged) > queues.MAX_TAGS:
            raise invalid(f"a queue has at most {queues.MAX_TAGS} tags")
        self._keep(caller, info, info.attrs, merged)
        return {}

    def untag_queue(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        if params.get("TagKeys") is None:
            raise SqsError("MissingParameter", "The request must contain the parameter TagKeys.")
        keys = texts(params["TagKeys"], "TagKeys")
        self._keep(caller, info, info.attrs, {k: v for k, v in info.tags.items()
                                              if k not in keys})
        return {}

    def _keep(self, caller: Caller, info: QueueInfo, attrs: dict[str, str],
              tags: dict[str, str]) -> None:
        text = queues.kept_text(attrs, tags, info.created or int(time.time()))
        caller.client.configure_queue(info.name, attributes=text)
        self.cache.drop(info.name)

    def list_queue_tags(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        return {"Tags": info.tags} if info.tags else {}

    def _sources(self, caller: Caller, dead: str) -> list[str]:
        """The queues whose dead-letter queue is ``dead`` (a page of queues a round trip)."""
        return [q.queue for q in caller.client.admin.describe_all()
                if q.queue != dead and queues.info_of(q).dead_letter == dead]

    def list_dead_letter_source_queues(self, params: dict[str, Any],
                                       caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller, fresh=True)
        return {"queueUrls": [self.url(caller, n) for n in self._sources(caller, info.name)]}

    def start_message_move_task(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        dead = queues.name_of_arn(params.get("SourceArn"), "SourceArn")
        if not self.cache.get(caller.client, dead, fresh=True).exists:
            raise SqsError("ResourceNotFoundException", f"The source queue {dead} does not "
                                                        "exist.")
        sources = self._sources(caller, dead)
        if not sources:
            raise invalid("Source queue must be configured as a Dead Letter Queue.")
        if params.get("DestinationArn") is not None:
            target = queues.name_of_arn(params["DestinationArn"], "DestinationArn")
            if target not in sources:
                raise SqsError("AWS.SimpleQueueService.UnsupportedOperation",
                               "messages move back to the queues they died in; "
                               "DestinationArn may only name one of those")
            sources = [target]
        moved = 0
        for source in sources:
            while True:  # each pass moves up to 10,000; it ends when none are left
                done = caller.client.redrive(source)
                moved += done
                if done < 10_000:
                    break
        return {"TaskHandle": base64.urlsafe_b64encode(
            f"{dead}:{moved}:{uuid.uuid4()}".encode()).decode()}

    def list_message_move_tasks(self, params: dict[str, Any], caller: Caller
                                ) -> dict[str, Any]:
        """None is ever running: StartMessageMoveTask is done before it answers."""
        dead = queues.name_of_arn(params.get("SourceArn"), "SourceArn")
        if not self.cache.get(caller.client, dead, fresh=True).exists:
            raise SqsError("ResourceNotFoundException", f"The source queue {dead} does not "
                                                        "exist.")
        return {"Results": []}

    def cancel_message_move_task(self, params: dict[str, Any], caller: Caller
                                 ) -> dict[str, Any]:
        raise SqsError("ResourceNotFoundException", "No such task running: a message move "
                                                    "task is done before StartMessageMoveTask "
                                                    "answers.")

    # -- messages --------------------------------------------------------------------------

    def _enqueue(self, caller: Caller, info: QueueInfo, entry: dict[str, Any]
                 ) -> tuple[int, dict[str, Any]]:
        """Send one message: its id (on a FIFO queue, the first's for a duplicate within
        SQS's five minutes) and the reply's fields."""
        payload, delay, group, dedup, reply = self._message(entry, info, caller)
        if not info.fifo:
            if caller.batcher is not None:  # with other connections' sends
                opts = EnqueueOptions.make(delay_s=delay, create=False)
                return caller.batcher.put(info.name, payload, opts), reply
            return caller.client.enqueue(info.name, payload, delay_s=delay,
                                         create=False), reply
        unique = dedup
        if info.attrs.get("DeduplicationScope") == "messageGroup":
            unique = hashlib.sha256(f"{group}\n{dedup}".encode()).hexdigest()
        item_id = caller.client.enqueue(info.name, payload, delay_s=delay, key=group,
                                        unique_key=unique, unique_for_s=DEDUP_S, create=False)
        reply["SequenceNumber"] = str(item_id)
        return item_id, reply

    def _message(self, entry: dict[str, Any], info: QueueInfo, caller: Caller
                 ) -> tuple[bytes, float, str, str, dict[str, Any]]:
        """An entry of a send checked: (payload, delay, group, dedup id, the reply's fields)."""
        body = msgs.check_body(entry.get("MessageBody"))
        attrs, attr_size = msgs.check_attributes(entry.get("MessageAttributes"),
                                                 caller.binary_base64)
        size = len(body.encode()) + attr_size
        limit = info.number("MaximumMessageSize")
        if size > limit:
            raise invalid(f"One or more parameters are invalid. Reason: Message must be shorter "
                          f"than {limit} bytes.")
        delay = entry.get("DelaySeconds")
        if delay is not None:
            if type(delay) is not int or not 0 <= delay <= 900:
                raise invalid(f"Value {delay} for parameter DelaySeconds is invalid. Reason: "
                              "must be from 0 to 900.")
            if info.fifo:
                raise invalid(f"Value {delay} for parameter DelaySeconds is invalid. Reason: "
                              "The request include parameter that is not valid for this queue "
                              "type (a FIFO queue's delay is the queue's DelaySeconds).")
        else:
            delay = info.number("DelaySeconds")
        group = entry.get("MessageGroupId")
        dedup = entry.get("MessageDeduplicationId")
        if info.fifo:
            if not isinstance(group, str) or not _GROUP_ID.fullmatch(group):
                raise SqsError("MissingParameter", "The request must contain the parameter "
                                                   "MessageGroupId (1-128 printable ASCII "
                                                   "characters).")
            if dedup is None and info.content_dedup:
                dedup = hashlib.sha256(body.encode()).hexdigest()
            if not isinstance(dedup, str) or not _GROUP_ID.fullmatch(dedup):
                raise invalid("The queue should either have ContentBasedDeduplication enabled "
                              "or MessageDeduplicationId provided explicitly")
        else:
            if dedup is not None:
                raise invalid("The request include parameter MessageDeduplicationId that is "
                              "not valid for this queue type")
            if group is not None and (not isinstance(group, str)
                                      or not _GROUP_ID.fullmatch(group)):
                raise invalid("MessageGroupId is 1-128 printable ASCII characters")
            group = group or ""
            dedup = ""
        payload = msgs.pack(body, attrs, group if info.fifo else "", dedup)
        reply: dict[str, Any] = {"MD5OfMessageBody": msgs.md5_of_body(body)}
        if attrs:
            reply["MD5OfMessageAttributes"] = msgs.md5_of_attributes(
                {n: {"DataType": k, ("BinaryValue" if k.startswith("Binary") else
                                     "StringValue"): v} for n, (k, v) in attrs.items()})
        return payload, float(delay), group if info.fifo else "", dedup, reply

    def send_message(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller)
        item_id, reply = self._enqueue(caller, info, params)
        reply["MessageId"] = str(item_id)
        return reply

    def send_message_batch(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller)
        entries = _entries(params)
        total = sum(len(str(e.get("MessageBody", "")).encode()) for e in entries)
        if total > 1_048_576:
            raise SqsError("AWS.SimpleQueueService.BatchRequestTooLong",
                           f"Batch requests cannot be longer than 1048576 bytes; this one is "
                           f"{total}")
        ok, failed = [], []
        for entry in entries:
            try:
                item_id, reply = self._enqueue(caller, info, entry)
            except SqsError as exc:
                failed.append(_failure(entry["Id"], exc))
                continue
            reply.update(Id=entry["Id"], MessageId=str(item_id))
            ok.append(reply)
        return {"Successful": ok, "Failed": failed}

    def receive_message(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller)
        n = params.get("MaxNumberOfMessages", 1)
        if type(n) is not int or not 1 <= n <= MAX_BATCH:
            raise invalid(f"Value {n} for parameter MaxNumberOfMessages is invalid. Reason: "
                          "Must be between 1 and 10, if provided.")
        wait = params.get("WaitTimeSeconds")
        if wait is None:
            wait = info.number("ReceiveMessageWaitTimeSeconds")
        if type(wait) is not int or not 0 <= wait <= MAX_WAIT_S:
            raise invalid(f"Value {wait} for parameter WaitTimeSeconds is invalid. Reason: "
                          "Must be >= 0 and <= 20, if provided.")
        visibility = params.get("VisibilityTimeout")
        if visibility is not None and (type(visibility) is not int
                                       or not 0 <= visibility <= queues.MAX_VISIBILITY_S):
            raise invalid(f"Value {visibility} for parameter VisibilityTimeout is invalid. "
                          "Reason: must be from 0 to 43200.")
        # a visibility of 0 (asked, or the queue's): leased long enough to read the items,
        # then given back at once
        at_once = visibility == 0 or (visibility is None and info.lease_s <= MIN_LEASE_S)
        lease_s = READ_S if at_once else None if visibility is None else float(visibility)
        system = set(texts(params.get("MessageSystemAttributeNames"),
                           "MessageSystemAttributeNames")) \
            | set(texts(params.get("AttributeNames"), "AttributeNames"))
        wanted = texts(params.get("MessageAttributeNames"), "MessageAttributeNames")
        # every parameter is checked by now: from here on items are leased
        got = caller.client.dequeue_many(info.name, n, lease_s=lease_s, wait_s=float(wait))
        out = [self._received(m, info, system, wanted, caller) for m in got]
        if at_once and got:
            caller.client.leases.nack_ids([m.id for m in got], [m.lease for m in got],
                                          delay_s=0.0, queue=info.name)
        return {"Messages": out} if out else {}

    def _received(self, m: Any, info: QueueInfo, system: set[str], wanted: list[str],
                  caller: Caller) -> dict[str, Any]:
        body = msgs.unpack(m.data)
        every = {"SentTimestamp": str(int(m.enqueued_at * 1000)),
                 "ApproximateReceiveCount": str(m.attempts + 1)}
        if info.fifo:
            every.update(MessageGroupId=m.key, MessageDeduplicationId=body.dedup,
                         SequenceNumber=str(m.id))
        elif body.group:
            every["MessageGroupId"] = body.group
        chosen = every if "All" in system else {k: v for k, v in every.items() if k in system}
        out: dict[str, Any] = {"MessageId": str(m.id),
                               "ReceiptHandle": self.receipts.issue(info.name, m.id, m.lease),
                               "MD5OfBody": msgs.md5_of_body(body.text), "Body": body.text}
        if chosen:
            out["Attributes"] = chosen
        picked = msgs.selected(body.attributes, wanted)
        if picked:
            out["MD5OfMessageAttributes"] = msgs.md5_of_attributes(picked)
            out["MessageAttributes"] = msgs.as_reply_attributes(picked, caller.binary_base64)
        return out

    def delete_message(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller)
        self._delete(info, params.get("ReceiptHandle"), caller)
        return {}

    def _delete(self, info: QueueInfo, handle: Any, caller: Caller) -> None:
        receipt = self.receipts.check(handle, info.name)
        try:  # late: as SQS, the latest handle deletes even after its visibility timeout
            if caller.batcher is not None:  # with other connections' deletes
                caller.batcher.ack(info.name, receipt.item_id, receipt.lease, late=True)
            else:
                caller.client.leases.ack_ids([receipt.item_id], [receipt.lease], info.name,
                                             late=True)
        except GONE:
            if info.fifo:  # as SQS: on a FIFO queue an expired handle is refused
                raise SqsError("ReceiptHandleIsInvalid",
                               "The receipt handle has expired.") from None
            # as SQS on a standard queue: a stale handle's delete succeeds and deletes nothing
            # (the item is another delivery's now, or gone)

    def delete_message_batch(self, params: dict[str, Any], caller: Caller) -> dict[str, Any]:
        info = self._queue(params, caller)
        ok, failed = [], []
        for entry in _entries(params):
            try:
                self._delete(info, entry.get("ReceiptHandle"), caller)
            except SqsError as exc:
                failed.append(_failure(entry["Id"], exc))
            else:
                ok.append({"Id": entry["Id"]})
        return {"Successful": ok, "Failed": failed}

    def change_message_visibility(self, params: dict[str, Any], caller: Caller
                                  ) -> dict[str, Any]:
        info = self._queue(params, caller)
        self._change(info, params, caller)
        return {}

    def _change(self, info: QueueInfo, entry: dict[str, Any], caller: Caller) -> None:
        receipt = self.receipts.check(entry.get("ReceiptHandle"), info.name)
        visibility = entry.get("VisibilityTimeout")
        if type(visibility) is not int or not 0 <= visibility <= queues.MAX_VISIBILITY_S:
            raise invalid(f"Value {visibility} for parameter VisibilityTimeout is invalid. "
                          "Reason: must be from 0 to 43200.")
        try:
            if visibility == 0:  # visible again at once
                caller.client.nack_ids([receipt.item_id], [receipt.lease], delay_s=0.0)
            else:
                caller.client.extend_ids([receipt.item_id], [receipt.lease],
                                         lease_s=float(visibility))
        except GONE:
            raise SqsError("AWS.SimpleQueueService.MessageNotInflight",
                           "Value for parameter ReceiptHandle is invalid. Reason: Message does "
                           "not exist or is not available for visibility timeout change.") \
                from None

    def change_message_visibility_batch(self, params: dict[str, Any], caller: Caller
                                        ) -> dict[str, Any]:
        info = self._queue(params, caller)
        ok, failed = [], []
        for entry in _entries(params):
            try:
                self._change(info, entry, caller)
            except SqsError as exc:
                failed.append(_failure(entry["Id"], exc))
            else:
                ok.append({"Id": entry["Id"]})
        return {"Successful": ok, "Failed": failed}


def _entries(params: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch's entries, checked: 1-10, each with a distinct valid Id."""
    entries = params.get("Entries")
    if not entries:
        raise SqsError("AWS.SimpleQueueService.EmptyBatchRequest",
                       "There should be at least one SendMessageBatchRequestEntry in the "
                       "request.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise invalid("Entries must be a list of entries")
    if len(entries) > MAX_BATCH:
        raise SqsError("AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {MAX_BATCH}. You have sent "
                       f"{len(entries)}.")
    ids = [e.get("Id") for e in entries]
    for i in ids:
        if not isinstance(i, str) or not _BATCH_ID.fullmatch(i):
            raise SqsError("AWS.SimpleQueueService.InvalidBatchEntryId",
                           "A batch entry id can only contain alphanumeric characters, "
                           "hyphens and underscores. It can be at most 80 letters long.")
    if len(set(ids)) != len(ids):
        raise SqsError("AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                       "Two or more batch entries in the request have the same Id.")
    return entries


def _failure(entry_id: str, exc: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": exc.sender, "Code": exc.code,
            "Message": exc.message}


def _untoken(token: Any) -> str:
    if token is None:
        return ""
    try:
        return base64.urlsafe_b64decode(str(token).encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise invalid("Invalid NextToken value.") from None
