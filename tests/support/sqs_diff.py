"""Differential runs of SQS calls: the same boto3 calls made to moto's server (``moto[server]``,
the reference the SQS tests of many projects use) and to ``blizzard sqs``, the answers compared.

A step is a label and a function of (a boto3 client, the run's notes on that server) that
makes one call and returns its answer; notes keep what later steps need (queue URLs, receipt
handles), each server its own. An answer is the call's response, or ``{"Error": code}`` for a
``ClientError``. Before comparing, both are put in one shape: ``ResponseMetadata`` and the
fields of ``VOLATILE`` (ids, handles, times, ARNs) are dropped, a queue URL becomes its last
path segment (the queue's name), error messages are left out (their codes are compared).

A difference is ``(label, path)``: the step and where in the answer, e.g. ``Messages.0.Body``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

VOLATILE = {"ResponseMetadata", "MessageId", "ReceiptHandle", "SentTimestamp", "SequenceNumber",
            "ApproximateFirstReceiveTimestamp", "CreatedTimestamp", "LastModifiedTimestamp",
            "QueueArn", "SenderId", "RequestId", "HostId"}
Step = tuple[str, Callable[[Any, dict[str, Any]], Any]]


def answer(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except ClientError as exc:
        return {"Error": exc.response["Error"]["Code"]}


def shape(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (v.rstrip("/").rsplit("/", 1)[-1] if k.endswith("QueueUrl") else shape(v))
                for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [v.rstrip("/").rsplit("/", 1)[-1] if isinstance(v, str) and "://" in v
                else shape(v) for v in value]
    return value


def paths(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two shaped answers differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(a.keys() | b.keys()):
            where = f"{at}.{k}" if at else k
            out += [where] if k not in a or k not in b else paths(a[k], b[k], where)
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for k, (x, y) in enumerate(zip(a, b, strict=True))
                for p in paths(x, y, f"{at}.{k}" if at else str(k))]
    return [] if a == b else [at]


def differences(steps: list[Step], reference: Any, ours: Any
                ) -> tuple[set[tuple[str, str]], list[str]]:
    """Each step on both clients in turn; the differences and a transcript of them."""
    notes: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    found: set[tuple[str, str]] = set()
    transcript: list[str] = []
    for label, step in steps:
        a = shape(answer(lambda: step(reference, notes[0])))  # noqa: B023 (called at once)
        b = shape(answer(lambda: step(ours, notes[1])))  # noqa: B023 (called at once)
        for where in paths(a, b):
            found.add((label, where))
            transcript.append(f"{label} / {where or 'answer'}: moto {_at(a, where)!r}, "
                              f"blizzard {_at(b, where)!r}")
    return found, transcript


def _at(value: Any, where: str) -> Any:
    for part in where.split(".") if where else []:
        if isinstance(value, dict):
            value = value.get(part, "<missing>")
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return "<missing>"
    return value
