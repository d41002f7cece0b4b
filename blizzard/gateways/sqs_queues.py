"""SQS queues as Blizzard queues: names, URLs and ARNs, and queue attributes.

An SQS queue is the Blizzard queue of the same name. Its attributes live in the cluster, so
every gateway sees the same ones and they survive restarts: those Blizzard has a setting for
are that setting (``VisibilityTimeout`` is ``lease_s``; a ``RedrivePolicy`` is ``dead_letter``
and ``max_attempts``), the rest and the tags are JSON in the queue's ``attributes`` setting,
which the master stores and does not read.

Attributes kept and reported but not acted on: ``MessageRetentionPeriod`` (Blizzard keeps an
item until it is acked or purged), ``RedriveAllowPolicy``, ``DeduplicationScope`` and
``FifoThroughputLimit``. Refused with a clear error: ``Policy`` (who may do what is the
gateway's ``--credentials`` roles), KMS keys and ``SqsManagedSseEnabled=true`` (items are
not encrypted at rest).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from blizzard.gateways.sqs_wire import SqsError, invalid, nonexistent, text
from blizzard.wire import protocol as p
from blizzard.wire.errors import InvalidArgument
from blizzard.wire.limits import MIN_LEASE_S
from blizzard.wire.queue_settings import MAX_ATTRIBUTES, check_queue_name

ACCOUNT = "000000000000"  # the account id in every URL and ARN: a gateway has one account
MAX_VISIBILITY_S = 43_200
_SQS_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_BOOL = {"true": True, "false": False}

# settable attribute -> (low, high) for integers, or a set of allowed texts
_NUMBERS = {"DelaySeconds": (0, 900), "MaximumMessageSize": (1024, 1_048_576),
            "MessageRetentionPeriod": (60, 1_209_600), "ReceiveMessageWaitTimeSeconds": (0, 20),
            "VisibilityTimeout": (0, MAX_VISIBILITY_S)}
_CHOICES = {"FifoQueue": {"true", "false"}, "ContentBasedDeduplication": {"true", "false"},
            "DeduplicationScope": {"messageGroup", "queue"},
            "FifoThroughputLimit": {"perQueue", "perMessageGroupId"},
            "SqsManagedSseEnabled": {"false"}}
_FIFO_ONLY = {"ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"}
_KEPT = {"RedrivePolicy", "RedriveAllowPolicy"}
_REFUSED = {"Policy": "access is decided by the gateway's --credentials roles (client, admin)",
            "KmsMasterKeyId": "items are not encrypted at rest",
            "KmsDataKeyReusePeriodSeconds": "items are not encrypted at rest"}
SETTABLE = set(_NUMBERS) | set(_CHOICES) | _KEPT
READ_ONLY = {"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
             "ApproximateNumberOfMessagesDelayed", "CreatedTimestamp", "LastModifiedTimestamp",
             "QueueArn"}
DEFAULTS = {"DelaySeconds": "0", "MaximumMessageSize": "1048576",
            "MessageRetentionPeriod": "345600", "ReceiveMessageWaitTimeSeconds": "0",
            "SqsManagedSseEnabled": "false"}
MAX_TAGS = 50


def check_name(name: Any) -> str:
    """An SQS queue name for CreateQueue: 1-80 of A-Z a-z 0-9 _ -, FIFO ones ending .fifo."""
    if not isinstance(name, str):
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    stem = name.removesuffix(".fifo")
    if not _SQS_NAME.fullmatch(stem) or len(name) > 80:
        raise invalid("Can only include alphanumeric characters, hyphens, or underscores. 1 to "
                      "80 in length (a FIFO queue's name ends in .fifo, within the 80)")
    return name


def name_of_url(url: Any) -> str:
    """The queue a ``QueueUrl`` names (its last path segment); any host is taken, as a
    client may reach the gateway by another name than the one in the URL it was given."""
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    try:
        path = urllib.parse.urlsplit(url).path if "://" in url else url
    except ValueError:
        raise nonexistent(url) from None
    parts = [part for part in path.split("/") if part]
    if not parts or len(parts) > 2:  # (any account id: a URL kept from elsewhere works)
        raise nonexistent(url)
    try:
        return check_queue_name(urllib.parse.unquote(parts[-1]))
    except InvalidArgument:
        raise nonexistent(url) from None


def name_of_arn(arn: Any, what: str) -> str:
    if not isinstance(arn, str) or not arn.startswith("arn:aws:sqs:"):
        raise invalid(f"Value {arn!r} for parameter {what} is invalid: not an SQS queue ARN")
    name = arn.rsplit(":", 1)[-1]
    try:
        return check_queue_name(name)
    except InvalidArgument:
        raise invalid(f"Value {arn!r} for parameter {what} is invalid: no such queue name") \
            from None


@dataclass
class QueueInfo:
    """What the gateway knows of a queue: read from the master, cached briefly."""

    name: str
    exists: bool
    lease_s: float
    max_attempts: int
    dead_letter: str
    attrs: dict[str, str] = field(default_factory=dict)  # kept attributes, as texts
    tags: dict[str, str] = field(default_factory=dict)
    created: int = 0  # seconds since 1970
    modified: int = 0
    counts: tuple[int, int, int] = (0, 0, 0)  # ready, leased, delayed

    @property
    def fifo(self) -> bool:
        return self.name.endswith(".fifo")

    def number(self, name: str) -> int:
        return int(self.attrs.get(name, DEFAULTS.get(name, "0")))

    @property
    def content_dedup(self) -> bool:
        return self.attrs.get("ContentBasedDeduplication") == "true"


def info_of(stats: p.QueueStats) -> QueueInfo:
    s: Any = stats.settings  # with_settings adds the fields, which mypy cannot see
    kept: dict[str, Any] = {}
    if s.attributes:
        try:
            kept = json.loads(s.attributes)
        except ValueError:
            kept = {}
    if not isinstance(kept, dict) or kept.get("sqs") != 1:
        kept = {}
    return QueueInfo(stats.queue, stats.exists, s.lease_s, s.max_attempts, s.dead_letter,
                     dict(kept.get("attrs", {})), dict(kept.get("tags", {})),
                     int(kept.get("created", 0)), int(kept.get("modified", 0)),
                     (stats.ready, stats.leased, stats.delayed))


def kept_text(attrs: dict[str, str], tags: dict[str, str], created: int) -> str:
    """The ``attributes`` setting's JSON; ``OverLimit`` past what the setting holds."""
    text = json.dumps({"sqs": 1, "attrs": attrs, "tags": tags, "created": created,
                       "modified": int(time.time())}, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_ATTRIBUTES:
        raise SqsError("OverLimit", f"the queue's attributes and tags take {len(text)} "
                                    f"characters as JSON; a queue keeps at most "
                                    f"{MAX_ATTRIBUTES}")
    return text


def check_attributes(given: Any, fifo: bool, creating: bool) -> dict[str, str]:
    """Settable attributes, each checked; ``InvalidAttributeName``/``Value`` otherwise."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise invalid("Attributes must be a map of name to value")
    out: dict[str, str] = {}
    for name, value in given.items():
        if name in _REFUSED:
            raise SqsError("InvalidAttributeName",
                           f"Attribute {name} is not supported here: {_REFUSED[name]}")
        if name in READ_ONLY or name not in SETTABLE:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if not isinstance(value, str):
            value = str(value)
        text(value, f"Attribute {name}", "InvalidAttributeValue")
        if name in _NUMBERS:
            low, high = _NUMBERS[name]
            if not value.isdigit() or not low <= int(value) <= high:
                raise SqsError("InvalidAttributeValue",
                               f"Invalid value for the parameter {name}: must be an integer "
                               f"from {low} to {high}")
            value = str(int(value))
        elif name in _CHOICES and value not in _CHOICES[name]:
            hint = (" (items are not encrypted at rest)" if name == "SqsManagedSseEnabled"
                    else "")
            raise SqsError("InvalidAttributeValue",
                           f"Invalid value for the parameter {name}: one of "
                           f"{', '.join(sorted(_CHOICES[name]))}{hint}")
        if name in _FIFO_ONLY and not fifo:
            raise SqsError("InvalidAttributeName",
                           f"Unknown Attribute {name}: it is for FIFO queues only.")
        if name == "FifoQueue":
            if not creating:
                raise SqsError("InvalidAttributeName",
                               "FifoQueue is set when the queue is created")
            if _BOOL[value] != fifo:
                raise SqsError("InvalidParameterValue",
                               "The name of a FIFO queue can only include alphanumeric "
                               "characters, hyphens, or underscores, must end with .fifo "
                               "suffix; and only a queue named .fifo is a FIFO queue")
            continue  # the name says it
        if name in ("RedrivePolicy", "RedriveAllowPolicy") and value:
            _check_policy_json(name, value)
        out[name] = value
    return out


def _check_policy_json(name: str, value: str) -> dict[str, Any]:
    try:
        policy = json.loads(value)
    except ValueError:
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}: "
                                                "not JSON") from None
    if not isinstance(policy, dict):
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}")
    if name == "RedrivePolicy":
        count = policy.get("maxReceiveCount")
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if type(count) is not int or not 1 <= count <= 1000 \
                or "deadLetterTargetArn" not in policy:
            raise SqsError("InvalidAttributeValue",
                           "Value for parameter RedrivePolicy is invalid. Reason: it needs "
                           "deadLetterTargetArn and maxReceiveCount from 1 to 1000.")
        name_of_arn(policy["deadLetterTargetArn"], "RedrivePolicy.deadLetterTargetArn")
    return policy


def same_value(name: str, current: str, given: str) -> bool:
    """Whether a queue's attribute already has the value a CreateQueue gives it (policies
    compared as JSON, however spaced)."""
    if name in ("RedrivePolicy", "RedriveAllowPolicy") and current and given:
        def norm(value: str) -> Any:
            policy = json.loads(value)
            if name == "RedrivePolicy":  # (checked: a count, as a number or digits)
                policy["maxReceiveCount"] = int(policy["maxReceiveCount"])
            return policy
        return bool(norm(current) == norm(given))
    return current == given


def settings_of(attrs: dict[str, str]) -> dict[str, Any]:
    """The Blizzard settings these attributes set (``lease_s``, ``dead_letter``, ...)."""
    out: dict[str, Any] = {}
    if "VisibilityTimeout" in attrs:
        out["lease_s"] = max(MIN_LEASE_S, float(attrs["VisibilityTimeout"]))
    if "RedrivePolicy" in attrs:
        if attrs["RedrivePolicy"]:
            policy = _check_policy_json("RedrivePolicy", attrs["RedrivePolicy"])
            out["dead_letter"] = name_of_arn(policy["deadLetterTargetArn"], "RedrivePolicy")
            out["max_attempts"] = int(policy["maxReceiveCount"])
        else:  # "" removes the policy: no dead-lettering
            out["dead_letter"], out["max_attempts"] = "", 0
    return out


def kept_of(attrs: dict[str, str]) -> dict[str, str]:
    """The attributes the ``attributes`` setting keeps (those Blizzard has no setting for)."""
    return {k: v for k, v in attrs.items() if k != "VisibilityTimeout"}


def reported(info: QueueInfo, arn: str) -> dict[str, str]:
    """Every attribute GetQueueAttributes can report for the queue."""
    out = dict(DEFAULTS)
    out.update({k: v for k, v in info.attrs.items() if k != "RedrivePolicy"})
    out["VisibilityTimeout"] = str(int(info.lease_s) if info.lease_s >= 1 else
                                   (0 if info.lease_s <= MIN_LEASE_S else math.ceil(info.lease_s)))
    if info.dead_letter and info.max_attempts:
        out["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": arn.rsplit(":", 1)[0] + ":"
                                           + info.dead_letter,
                                           "maxReceiveCount": info.max_attempts},
                                          separators=(",", ":"))
    ready, leased, delayed = info.counts
    out.update({"ApproximateNumberOfMessages": str(ready),
                "ApproximateNumberOfMessagesNotVisible": str(leased),
                "ApproximateNumberOfMessagesDelayed": str(delayed),
                "CreatedTimestamp": str(info.created), "LastModifiedTimestamp": str(info.modified),
                "QueueArn": arn})
    if info.fifo:
        out["FifoQueue"] = "true"
        out.setdefault("ContentBasedDeduplication", "false")
        out.setdefault("DeduplicationScope", "queue")
        out.setdefault("FifoThroughputLimit", "perQueue")
    return out


def check_tags(tags: Any) -> dict[str, str]:
    if not isinstance(tags, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in tags.items()):
        raise invalid("Tags must be a map of text to text")
    for k, v in tags.items():
        if not 1 <= len(k) <= 128 or len(v) > 256:
            raise invalid("A tag's key is 1-128 characters and its value at most 256")
        text(k, "A tag's key")
        text(v, "A tag's value")
    return tags
