"""SQS messages as Blizzard items: bodies and message attributes, their MD5s, and receipt
handles.

An item's payload is the message body's UTF-8 bytes, as it is: a consumer of Blizzard's own
client (or of the beanstalkd gateway) reads what an SQS producer sent. A message that carries
more (message attributes, a FIFO queue's group and deduplication ids) is an *envelope*: a zero
byte and ``SQS1``, then a MessagePack array ``[body, attributes, group, dedup id]``. A zero
byte cannot begin an SQS body (SQS refuses it), so the two never mix up. An item another
client enqueued whose bytes are not valid SQS text is handed out base64-encoded, with the
message attribute ``Blizzard.BodyEncoding`` saying so.

A receipt handle names the queue, the item and its lease token, with an HMAC-SHA256 tag under
the gateway's handle key: a handle the gateway never issued is ``ReceiptHandleIsInvalid``,
and one issued for an earlier delivery carries that delivery's token, which the master
refuses once the item is leased under another: a stale handle never deletes an item another
consumer holds now.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from blizzard.gateways.sqs_wire import INVALID_TEXT, SqsError, invalid

ENVELOPE = b"\x00SQS1"
MAX_ATTRIBUTES = 10  # message attributes per message, as SQS
ENCODING_ATTRIBUTE = "Blizzard.BodyEncoding"
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.-]{1,250})?")


@dataclass
class Body:
    """A message as the gateway reads it back from an item's payload."""

    text: str
    attributes: dict[str, dict[str, Any]]  # name -> {"DataType": ..., "StringValue"|"BinaryValue"}
    group: str = ""
    dedup: str = ""


def check_body(body: Any) -> str:
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    bad = INVALID_TEXT.search(body)
    if bad:
        raise SqsError("InvalidMessageContents",
                       f"Invalid binary character '#x{ord(bad.group()):X}' was found in the "
                       "message body, the set of allowed characters is #x9 | #xA | #xD | "
                       "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")
    return body


def check_attributes(attrs: Any, binary_in_base64: bool) -> tuple[dict[str, list[Any]], int]:
    """Message attributes as an envelope keeps them (name -> [type, value]) and their size in
    bytes (what counts toward the queue's MaximumMessageSize); ``InvalidParameterValue`` for a
    bad one. ``binary_in_base64``: BinaryValue comes base64-encoded (the JSON protocol's and
    the query protocol's form both do)."""
    if attrs is None:
        return {}, 0
    if not isinstance(attrs, dict):
        raise invalid("MessageAttributes must be a map of name to value")
    if len(attrs) > MAX_ATTRIBUTES:
        raise invalid(f"Number of message attributes [{len(attrs)}] exceeds the allowed maximum "
                      f"[{MAX_ATTRIBUTES}].")
    out: dict[str, list[Any]] = {}
    size = 0
    for name, value in attrs.items():
        if not _ATTRIBUTE_NAME.fullmatch(name) or ".." in name or name.startswith(".") \
                or name.endswith(".") or name.lower().startswith(("aws.", "amazon.")):
            raise invalid(f"Message attribute name '{name}' is invalid: use up to 256 of "
                          "A-Z a-z 0-9 _ - . (not first or last, never two in a row), not "
                          "starting with AWS. or Amazon.")
        if not isinstance(value, dict):
            raise invalid(f"Message attribute '{name}' must have a DataType and a value")
        kind = value.get("DataType")
        if not isinstance(kind, str) or not _DATA_TYPE.fullmatch(kind):
            raise invalid(f"The message attribute '{name}' has an invalid message attribute "
                          "type, the set of supported type prefixes is Binary, Number, and "
                          "String.")
        if kind.startswith("Binary"):
            raw = value.get("BinaryValue")
            if not isinstance(raw, (str, bytes)) or "StringValue" in value:
                raise invalid(f"Message attribute '{name}' with type 'Binary' must use field "
                              "'Binary'.")
            data = _unbase64(raw, name) if binary_in_base64 and isinstance(raw, str) else raw
            if isinstance(data, str):
                data = data.encode()
            out[name] = [kind, data]
            size += len(data)
        else:
            text = value.get("StringValue")
            if not isinstance(text, str) or "BinaryValue" in value:
                raise invalid(f"Message attribute '{name}' must contain a non-empty message "
                              f"attribute value for message attribute type '{kind}'.")
            if not text or INVALID_TEXT.search(text):
                raise invalid(f"Message attribute '{name}' must contain a non-empty value of "
                              "valid characters.")
            if kind.startswith("Number") and not _is_number(text):
                raise invalid(f"Message attribute '{name}' has an invalid Number value.")
            out[name] = [kind, text]
            size += len(text.encode())
        size += len(name.encode()) + len(kind.encode())
    return out, size


def _unbase64(text: str, name: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"Message attribute '{name}': BinaryValue is not base64") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return len(text) <= 40


def pack(body: str, attrs: dict[str, list[Any]], group: str = "", dedup: str = "") -> bytes:
    """An item's payload for a message: the body's bytes alone when that says everything."""
    if not attrs and not group and not dedup:
        return body.encode()
    packed: bytes = msgpack.packb([body, attrs, group, dedup], use_bin_type=True)
    return ENVELOPE + packed


def unpack(data: bytes) -> Body:
    """What a payload says: an envelope's parts, or a plain body (base64 if not SQS text)."""
    if data.startswith(ENVELOPE):
        envelope = _envelope(data[len(ENVELOPE):])
        if envelope is not None:
            return envelope  # (else not one after all: below, as bytes)
    try:
        text = data.decode("utf-8")
        if text and not INVALID_TEXT.search(text):
            return Body(text, {})
    except UnicodeDecodeError:
        pass
    return Body(base64.b64encode(data).decode(),
                {ENCODING_ATTRIBUTE: {"DataType": "String", "StringValue": "base64"}})


def _envelope(packed: bytes) -> Body | None:
    """An envelope's parts, or None if these bytes are not one this gateway writes (another
    client's item that merely starts like one)."""
    try:
        parts = msgpack.unpackb(packed, raw=False, max_str_len=len(packed),
                                max_bin_len=len(packed), max_array_len=64, max_map_len=64)
    except Exception:  # msgpack raises several kinds on bytes that are not its own
        return None
    if type(parts) is not list or len(parts) != 4:
        return None
    body, attrs, group, dedup = parts
    if not (_is_text(body) and _is_text(group) and _is_text(dedup) and type(attrs) is dict):
        return None
    out: dict[str, dict[str, Any]] = {}
    for name, value in attrs.items():
        if not _is_text(name) or type(value) is not list or len(value) != 2 \
                or not _is_text(value[0]):
            return None
        kind, raw = value
        if not (type(raw) is bytes if kind.startswith("Binary") else _is_text(raw)):
            return None
        out[name] = _attribute(kind, raw)
    return Body(body, out, group, dedup)


def _is_text(value: Any) -> bool:
    return type(value) is str and not INVALID_TEXT.search(value)


def _attribute(kind: str, value: Any) -> dict[str, Any]:
    if kind.startswith("Binary"):
        return {"DataType": kind, "BinaryValue": value}
    return {"DataType": kind, "StringValue": value}


def md5_of_body(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def md5_of_attributes(attrs: dict[str, dict[str, Any]]) -> str:
    """SQS's digest of message attributes: each by name, as length-prefixed name, type, a
    transport byte (1 text, 2 binary) and length-prefixed value."""
    h = hashlib.md5(usedforsecurity=False)
    for name in sorted(attrs):
        value = attrs[name]
        kind = value["DataType"]
        for part in (name.encode(), kind.encode()):
            h.update(struct.pack(">I", len(part)) + part)
        if "BinaryValue" in value:
            raw = value["BinaryValue"]
            h.update(b"\x02" + struct.pack(">I", len(raw)) + raw)
        else:
            raw = value["StringValue"].encode()
            h.update(b"\x01" + struct.pack(">I", len(raw)) + raw)
    return h.hexdigest()


def as_reply_attributes(attrs: dict[str, dict[str, Any]], base64_binary: bool
                        ) -> dict[str, dict[str, Any]]:
    """Attributes as a reply carries them (binary values base64 for JSON and XML)."""
    if not base64_binary:
        return attrs
    return {name: ({"DataType": v["DataType"],
                    "BinaryValue": base64.b64encode(v["BinaryValue"]).decode()}
                   if "BinaryValue" in v else v) for name, v in attrs.items()}


def selected(attrs: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    """The attributes a receive asked for: by name, ``All``/``.*``, or ``prefix.*``."""
    if not names:
        return {}
    if "All" in names or ".*" in names:
        return dict(attrs)
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*"))
    return {k: v for k, v in attrs.items() if k in names or (prefixes and k.startswith(prefixes))}


# -- receipt handles ------------------------------------------------------------------------

@dataclass(frozen=True)
class Receipt:
    queue: str
    item_id: int
    lease: int


class Receipts:
    """Issues and checks receipt handles under one key (gateways that share it accept each
    other's handles)."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def issue(self, queue: str, item_id: int, lease: int) -> str:
        body = base64.urlsafe_b64encode(msgpack.packb([queue, item_id, lease])).decode()
        return f"{body}.{self._tag(body)}"

    def check(self, handle: Any, queue: str) -> Receipt:
        if not isinstance(handle, str) or not handle:
            raise SqsError("MissingParameter", "The request must contain the parameter "
                                               "ReceiptHandle.")
        body, _, tag = handle.partition(".")
        if len(handle) > 1024 or not hmac.compare_digest(self._tag(body), tag):
            raise SqsError("ReceiptHandleIsInvalid",
                           f'The input receipt handle "{handle[:100]}" is not a valid receipt '
                           "handle.")
        named, item_id, lease = msgpack.unpackb(base64.urlsafe_b64decode(body))
        if named != queue:
            raise SqsError("ReceiptHandleIsInvalid",
                           f"The input receipt handle is for another queue ({named}).")
        return Receipt(named, item_id, lease)

    def _tag(self, body: str) -> str:
        return hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()[:32]
