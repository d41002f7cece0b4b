"""SQS's two wire forms, both on one port: the AWS JSON 1.0 protocol (``X-Amz-Target:
AmazonSQS.<Action>``, a JSON body: what current SDKs send) and the older query protocol (a
form-encoded ``Action=...`` body or query, XML replies).

A request becomes ``(action, params)`` with ``params`` in the JSON protocol's shape whichever
form it came in (``from_form`` turns ``Attribute.1.Name=...`` style pairs into the JSON
protocol's maps and lists); a result, a dict in the JSON protocol's shape, is written back in
the form the request came in (``to_xml`` for the query protocol). Errors are ``SqsError``s
with SQS's codes: as JSON, a ``__type`` and the ``x-amzn-query-error`` header SDKs read the
query protocol's code from; as XML, an ``ErrorResponse``.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Any
from xml.sax.saxutils import escape as _escape

XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
JSON_TYPE = "application/x-amz-json-1.0"
MAX_FORM_PAIRS = 2000  # a batch of 10 entries with 10 attributes each is about 500
MAX_CONTAINERS = 2000  # objects and arrays in a JSON body (that batch has about 250)
# what SQS takes as text, in bodies, attributes and tags: XML 1.0's characters
INVALID_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')


def _text(value: str) -> str:
    """``value`` as XML character data that parses back to itself: ``& < >`` escaped, and a
    carriage return as ``&#xD;`` (an XML parser reads a bare CR, or CR LF, as LF, so an SDK
    would see another body than the one MD5OfBody was taken of, as SQS's own replies avoid)."""
    return _escape(value, {"\r": "&#xD;"})


class SqsError(Exception):
    """An SQS error reply: ``code`` is the query protocol's code (what SDKs show)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.shape, self.status, self.sender = ERRORS.get(code, (code, 400, True))


# code -> (the JSON protocol's shape name, HTTP status, the client's fault?)
ERRORS: dict[str, tuple[str, int, bool]] = {
    "AWS.SimpleQueueService.NonExistentQueue": ("QueueDoesNotExist", 400, True),
    "QueueAlreadyExists": ("QueueNameExists", 400, True),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400, True),
    "AWS.SimpleQueueService.TooManyEntriesInBatchRequest": ("TooManyEntriesInBatchRequest",
                                                            400, True),
    "AWS.SimpleQueueService.EmptyBatchRequest": ("EmptyBatchRequest", 400, True),
    "AWS.SimpleQueueService.BatchEntryIdsNotDistinct": ("BatchEntryIdsNotDistinct", 400, True),
    "AWS.SimpleQueueService.InvalidBatchEntryId": ("InvalidBatchEntryId", 400, True),
    "AWS.SimpleQueueService.BatchRequestTooLong": ("BatchRequestTooLong", 400, True),
    "AWS.SimpleQueueService.MessageNotInflight": ("MessageNotInflight", 400, True),
    "AWS.SimpleQueueService.PurgeQueueInProgress": ("PurgeQueueInProgress", 400, True),
    "AWS.SimpleQueueService.UnsupportedOperation": ("UnsupportedOperation", 400, True),
    "InvalidAttributeName": ("InvalidAttributeName", 400, True),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400, True),
    "InvalidMessageContents": ("InvalidMessageContents", 400, True),
    "OverLimit": ("OverLimit", 403, True),
    "RequestThrottled": ("RequestThrottled", 403, True),
    "ResourceNotFoundException": ("ResourceNotFoundException", 400, True),
    "InvalidParameterValue": ("InvalidParameterValue", 400, True),
    "MissingParameter": ("MissingParameter", 400, True),
    "InvalidAction": ("InvalidAction", 400, True),
    "MalformedQueryString": ("MalformedQueryString", 400, True),
    "SerializationException": ("SerializationException", 400, True),
    "AccessDenied": ("AccessDenied", 403, True),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403, True),
    "IncompleteSignature": ("IncompleteSignature", 403, True),
    "InvalidClientTokenId": ("InvalidClientTokenId", 403, True),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403, True),
    "RequestExpired": ("RequestExpired", 403, True),
    "ServiceUnavailable": ("ServiceUnavailable", 503, False),
    "InternalError": ("InternalError", 500, False),
}


def nonexistent(url_or_name: str) -> SqsError:
    return SqsError("AWS.SimpleQueueService.NonExistentQueue",
                    f"The specified queue does not exist: {url_or_name}")


def invalid(message: str) -> SqsError:
    return SqsError("InvalidParameterValue", message)


def text(value: Any, name: str, code: str = "InvalidParameterValue") -> str:
    """``value`` if it is text SQS takes (a string of XML's characters), else ``code``."""
    if not isinstance(value, str):
        raise SqsError(code, f"{name} must be a string")
    if INVALID_TEXT.search(value):
        raise SqsError(code, f"{name} holds a character SQS does not take")
    return value


def texts(value: Any, name: str) -> list[str]:
    """``value`` if it is a list of such strings (None: an empty list)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"{name} must be a list of strings")
    return [text(v, name) for v in value]


# -- requests -------------------------------------------------------------------------------

def from_json(action_header: str, body: bytes) -> tuple[str, dict[str, Any]]:
    """A JSON protocol request's action and parameters."""
    prefix, _, action = action_header.partition(".")
    if prefix != "AmazonSQS" or not action:
        raise SqsError("InvalidAction", f"X-Amz-Target {action_header!r} is not "
                                        "AmazonSQS.<Action>")
    # each object or array costs ~50 times its two bytes once parsed: count them first
    if body.count(b"{") + body.count(b"[") > MAX_CONTAINERS:
        bare = _STRINGS.sub(b"", body)  # brackets inside strings do not count
        containers = bare.count(b"{") + bare.count(b"[")
        if containers > MAX_CONTAINERS:
            raise SqsError("SerializationException",
                           f"the body holds {containers} objects and arrays; a request "
                           f"takes at most {MAX_CONTAINERS}")
    try:
        params = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SqsError("SerializationException", f"the body is not JSON: {exc}") from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "the body must be a JSON object")
    return action, params


# query protocol: "Name.N.Part" lists and maps -> the JSON protocol's key and how to fold them
_MAPS = {"Attribute": "Attributes", "Tag": "Tags", "MessageAttribute": "MessageAttributes",
         "MessageSystemAttribute": "MessageSystemAttributes"}
_LISTS = {"AttributeName": "AttributeNames", "MessageAttributeName": "MessageAttributeNames",
          "MessageSystemAttributeName": "MessageSystemAttributeNames", "TagKey": "TagKeys"}
_ENTRIES = re.compile(r"(\w+BatchRequestEntry)\.(\d{1,3})\.(.+)")
_INDEXED = re.compile(r"(\w+)\.(\d{1,3})(?:\.(.+))?")
_INTS = {"DelaySeconds", "MaxNumberOfMessages", "VisibilityTimeout", "WaitTimeSeconds",
         "MaxResults", "MaxNumberOfMessagesPerSecond"}


def from_form(pairs: list[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """A query protocol request's action and parameters, in the JSON protocol's shape."""
    if len(pairs) > MAX_FORM_PAIRS:
        raise SqsError("MalformedQueryString", f"more than {MAX_FORM_PAIRS} parameters")
    flat: dict[str, str] = {}
    for name, value in pairs:
        if name in flat:
            raise SqsError("MalformedQueryString", f"parameter {name} given twice")
        flat[name] = value
    action = flat.pop("Action", "")
    flat.pop("Version", None)
    if not action:
        raise SqsError("MissingParameter", "the request names no Action")
    entries: dict[tuple[str, int], dict[str, str]] = {}
    rest: dict[str, str] = {}
    for name, value in flat.items():
        m = _ENTRIES.fullmatch(name)
        if m:
            entries.setdefault((m[1], int(m[2])), {})[m[3]] = value
        else:
            rest[name] = value
    params = _fold(rest)
    for kind in sorted({k for k, _ in entries}):
        params["Entries"] = [_fold(entries[(k, n)]) for k, n in sorted(entries) if k == kind]
    return action, params


def _fold(flat: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    maps: dict[str, dict[int, dict[str, str]]] = {}
    lists: dict[str, dict[int, str]] = {}
    for name, text in flat.items():
        m = _INDEXED.fullmatch(name)
        if m and m[1] in _MAPS and m[3]:
            maps.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[3]] = text
        elif m and m[1] in _LISTS and not m[3]:
            lists.setdefault(m[1], {})[int(m[2])] = text
        elif name in _INTS:
            try:
                out[name] = int(text)
            except ValueError:
                raise invalid(f"Value {text!r} for parameter {name} is invalid: not an "
                              "integer") from None
        else:
            out[name] = text
    for kind, items in maps.items():
        folded: dict[str, Any] = {}
        for _, parts in sorted(items.items()):
            key = parts.get("Name", parts.get("Key"))
            if key is None:
                raise SqsError("MissingParameter", f"{kind}.N needs a Name")
            if kind in ("MessageAttribute", "MessageSystemAttribute"):
                value: Any = {k.removeprefix("Value."): v for k, v in parts.items()
                              if k.startswith("Value.")}
            else:
                value = parts.get("Value", "")
            folded[key] = value
        out[_MAPS[kind]] = folded
    for kind, listed in lists.items():
        out[_LISTS[kind]] = [v for _, v in sorted(listed.items())]
    return out


# -- replies --------------------------------------------------------------------------------

def json_error(err: SqsError) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"__type": f"com.amazonaws.sqs#{err.shape}", "message": err.message})
    header = f"{err.code};{'Sender' if err.sender else 'Receiver'}"
    return body.encode(), {"x-amzn-query-error": header}


def xml_error(err: SqsError, request_id: str) -> bytes:
    return (f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error><Type>'
            f'{"Sender" if err.sender else "Receiver"}</Type><Code>{_text(err.code)}</Code>'
            f'<Message>{_text(err.message)}</Message><Detail/></Error>'
            f'<RequestId>{request_id}</RequestId></ErrorResponse>').encode()


# how the query protocol names each list's members and spells maps
_MEMBER = {"Messages": "Message", "QueueUrls": "QueueUrl", "queueUrls": "QueueUrl",
           "Successful": None, "Failed": "BatchResultErrorEntry"}
_BATCH_ENTRY = {"SendMessageBatch": "SendMessageBatchResultEntry",
                "DeleteMessageBatch": "DeleteMessageBatchResultEntry",
                "ChangeMessageVisibilityBatch": "ChangeMessageVisibilityBatchResultEntry"}


# the actions whose replies carry no result: SQS's XML has no <ActionResult> for them
NO_RESULT = frozenset({"DeleteMessage", "ChangeMessageVisibility", "PurgeQueue", "DeleteQueue",
                       "SetQueueAttributes", "TagQueue", "UntagQueue", "AddPermission",
                       "RemovePermission"})


def to_xml(action: str, result: dict[str, Any], request_id: str) -> bytes:
    """A result in the query protocol's XML."""
    inner = "".join(_xml_field(action, k, v) for k, v in result.items())
    wrapped = "" if action in NO_RESULT and not inner else \
        f"<{action}Result>{inner}</{action}Result>"
    return (f'<?xml version="1.0"?><{action}Response xmlns="{XMLNS}">{wrapped}'
            f'<ResponseMetadata><RequestId>{request_id}</RequestId>'
            f'</ResponseMetadata></{action}Response>').encode()


def _xml_field(action: str, name: str, value: Any) -> str:
    if name == "Attributes" and isinstance(value, dict):
        return "".join(f"<Attribute><Name>{_text(k)}</Name><Value>{_text(str(v))}</Value>"
                       f"</Attribute>" for k, v in value.items())
    if name == "Tags":
        return "".join(f"<Tag><Key>{_text(k)}</Key><Value>{_text(v)}</Value></Tag>"
                       for k, v in value.items())
    if name == "MessageAttributes":
        out = []
        for k, v in value.items():
            parts = "".join(f"<{p}>{_text(str(x))}</{p}>" for p, x in v.items())
            out.append(f"<MessageAttribute><Name>{_text(k)}</Name><Value>{parts}</Value>"
                       f"</MessageAttribute>")
        return "".join(out)
    if isinstance(value, list):
        member = _MEMBER.get(name, name) or _BATCH_ENTRY[action]
        return "".join(_xml_element(member, v) for v in value)
    return _xml_element(name, value)


def _xml_element(name: str, value: Any) -> str:
    if isinstance(value, dict):
        inner = "".join(_xml_field("", k, v) for k, v in value.items())
        return f"<{name}>{inner}</{name}>"
    if isinstance(value, bool):
        value = "true" if value else "false"
    return f"<{name}>{_text(str(value))}</{name}>"


def form_pairs(body: bytes, query: str) -> list[tuple[str, str]]:
    """A query protocol request's parameters, from its query and its form-encoded body."""
    try:
        text = body.decode("utf-8")
        return (urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False,
                                       max_num_fields=MAX_FORM_PAIRS)
                + urllib.parse.parse_qsl(text, keep_blank_values=True,
                                         max_num_fields=MAX_FORM_PAIRS))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SqsError("MalformedQueryString", f"the form is not valid: {exc}") from None

