"""Differential runs of SQS calls: the same boto3 calls made to moto's server (``moto[server]``,
the reference the SQS tests of many projects use) and to ``blizzard sqs``, the answers compared.

A step is a label and a function of (a boto3 client, the run's notes on that server) that
makes one call and returns its answer; notes keep what later steps need (queue URLs, receipt
handles), each server its own. An answer is the call's response, or ``{"Error": code}`` for a
``ClientError``. Before comparing, both are put in one shape: ``ResponseMetadata`` and the
fields of ``VOLATILE`` (ids, handles, times, ARNs) are dropped, a queue URL becomes its last
path segment (the queue's name), error messages are left out (their codes are compared).

A difference is ``(label, path)``: the step and where in the answer, e.g. ``Messages.0.Body``.
The query protocol's steps call a ``FormClient`` instead of boto3: a signed form, its XML reply
read as an SDK reads it, into a dict of the same kind.
"""

from __future__ import annotations

import http.client
import urllib.parse
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

VOLATILE = {"ResponseMetadata", "MessageId", "ReceiptHandle", "SentTimestamp", "SequenceNumber",
            "ApproximateFirstReceiveTimestamp", "CreatedTimestamp", "LastModifiedTimestamp",
            "QueueArn", "SenderId", "RequestId", "HostId",
            "Message"}  # a batch entry's error text (its Code is compared)
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


class FormClient:
    """The query protocol's client: a signed form POSTed to ``url``, its XML reply as a dict
    (``{"Error": code}`` for an ``ErrorResponse``), for steps that run on the older wire."""

    def __init__(self, url: str, key: tuple[str, str]) -> None:
        self.url, self.key = url, key

    def __call__(self, **params: str) -> Any:
        req = AWSRequest(method="POST", url=self.url + "/", data=urllib.parse.urlencode(params),
                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        SigV4Auth(Credentials(*self.key), "sqs", "us-east-1").add_auth(req)
        prepared = req.prepare()
        parts = urllib.parse.urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        try:
            conn.request("POST", "/", body=prepared.body, headers=dict(prepared.headers))
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            root = ET.fromstring(raw)
        except ET.ParseError:
            return {"Error": f"<not XML: HTTP {resp.status} {raw[:60]!r}>"}
        if _tag(root) == "ErrorResponse":
            found = root.find(".//{*}Code")
            return {"Error": found.text if found is not None else "<no code>"}
        result = next((e for e in root if _tag(e).endswith("Result")), None)
        return {} if result is None else _as_dict(result)


def _tag(element: Any) -> str:
    return str(element.tag).rsplit("}", 1)[-1]


def _as_dict(element: Any) -> Any:
    """An element's children by tag (a tag seen more than once: a list), or its text."""
    children = list(element)
    if not children:
        return element.text or ""
    out: dict[str, Any] = {}
    for child in children:
        value = _as_dict(child)
        tag = _tag(child)
        if tag in out:
            out[tag] = (out[tag] if isinstance(out[tag], list) else [out[tag]]) + [value]
        else:
            out[tag] = value
    return out
