"""AWS Signature Version 4, checked: who signed an SQS request, from the access keys the
gateway was given (``--credentials FILE``).

The file has one access key a line: ``ACCESS_KEY_ID SECRET_ACCESS_KEY ROLE``, the role
``client`` or ``admin`` (what the key may do, as Blizzard's keys of those roles); blank lines
and lines starting with ``#`` are skipped.

A request is signed in its ``Authorization`` header (what every SDK sends): the signature is
recomputed over the request's method, path, query, the headers it names, and the SHA-256 of
its body, with the key derived from the secret, the scope's date, region and service
(``sqs``). Every ``X-Amz-*`` header sent must be among those signed (``X-Amz-Target``
names the action: a relayed request cannot be turned into another). The request's time
(``X-Amz-Date``) must lie within ``MAX_SKEW_S`` of the gateway's clock, so a captured request
cannot be replayed later. Pre-signed URLs (the signature in the query) are not taken.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_S = 15 * 60  # as AWS: a request signed more than this before or after now is refused
ROLES = ("client", "admin")
_KEY_ID = re.compile(r"[A-Za-z0-9+/=_-]{1,128}")
_AUTH = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),"
                   r"\s*Signature=([0-9a-f]{64})\s*")


class SignatureError(Exception):
    """A request whose signature is missing, malformed, stale or wrong; ``code`` is AWS's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Credential:
    key_id: str
    secret: str
    role: str  # "client" or "admin"


def load_credentials(path: str) -> dict[str, Credential]:
    """The access keys in ``path`` by id; ``ValueError`` naming the line of a bad one."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path} holds secret keys and may be read by others (mode "
                         f"{stat.S_IMODE(mode):o}); make it the owner's alone: chmod 600 {path}")
    keys: dict[str, Credential] = {}
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            text = raw.strip()
            if not text or text.startswith("#"):
                continue
            parts = text.split()
            if len(parts) != 3 or parts[2] not in ROLES or not _KEY_ID.fullmatch(parts[0]) \
                    or not 8 <= len(parts[1]) <= 256:
                raise ValueError(f"{path}, line {n}: expected ACCESS_KEY_ID SECRET_ACCESS_KEY "
                                 f"ROLE (the role client or admin, a secret of 8-256 "
                                 f"characters)")
            if parts[0] in keys:
                raise ValueError(f"{path}, line {n}: access key {parts[0]} given twice")
            keys[parts[0]] = Credential(*parts)
    if not keys:
        raise ValueError(f"{path} has no access keys (lines ACCESS_KEY_ID SECRET ROLE)")
    return keys


def _canonical_queries(query: str) -> list[str]:
    """The query's canonical forms: each name and value encoded as the specification says,
    and (if different) as sent, which is what SDKs sign a query already in their URL with."""
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    encoded = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}="
                       f"{urllib.parse.quote(v, safe='-_.~')}" for k, v in sorted(pairs))
    raw = "&".join(f"{k}={v}" for k, _, v in sorted(p.partition("=") for p in query.split("&")
                                                   if query))
    return [encoded] if raw == encoded else [encoded, raw]


def _canonical_path(path: str) -> str:
    """The path as sent, encoded once more (AWS's rule for every service but S3)."""
    return urllib.parse.quote(path or "/", safe="/~")


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def verify(method: str, target: str, headers: Any, body: bytes,
           keys: Mapping[str, Credential], now: float | None = None) -> Credential:
    """The credential that signed this request, or ``SignatureError``.

    ``target`` is the request line's path and query as sent; ``headers`` are looked up
    without regard to case (an ``email.message.Message``, say)."""
    auth = headers.get("Authorization")
    if not auth:
        raise SignatureError("MissingAuthenticationToken",
                             "Request is missing Authentication Token: sign requests with AWS "
                             "Signature Version 4 and an access key of this gateway's "
                             "--credentials")
    m = _AUTH.fullmatch(auth)
    if m is None:
        raise SignatureError("IncompleteSignature",
                             f"the Authorization header is not {ALGORITHM} Credential=..., "
                             "SignedHeaders=..., Signature=...")
    credential, signed, signature = m.groups()
    scope = credential.split("/")
    if len(scope) != 5 or scope[4] != "aws4_request" or scope[3] != "sqs":
        raise SignatureError("IncompleteSignature",
                             "the credential must be KEY/DATE/REGION/sqs/aws4_request")
    key_id, date, region, service = scope[:4]
    cred = keys.get(key_id)
    if cred is None:
        raise SignatureError("InvalidClientTokenId",
                             "The security token included in the request is invalid: no such "
                             "access key")
    stamp = headers.get("X-Amz-Date", "")
    try:
        when = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise SignatureError("IncompleteSignature",
                             "X-Amz-Date must be given, as YYYYMMDDTHHMMSSZ") from None
    if stamp[:8] != date:
        raise SignatureError("SignatureDoesNotMatch",
                             "the credential's date is not X-Amz-Date's")
    now = time.time() if now is None else now
    if abs(when.timestamp() - now) > MAX_SKEW_S:
        raise SignatureError("RequestExpired",
                             f"Signature expired: {stamp} is more than {MAX_SKEW_S // 60} "
                             "minutes from the gateway's time")
    names = signed.split(";")
    if "host" not in names or names != sorted(names):
        raise SignatureError("SignatureDoesNotMatch",
                             "SignedHeaders must be sorted and include host")
    # every X-Amz-* header sent (X-Amz-Target names the action) must be signed, or whoever
    # relays a request could change what it does
    unsigned = sorted({name.lower() for name in headers.keys()
                       if name.lower().startswith("x-amz-")} - set(names))
    if unsigned:
        raise SignatureError("SignatureDoesNotMatch",
                             f"headers sent but not signed: {', '.join(unsigned)}")
    lines = []
    for name in names:
        value = headers.get(name)
        if value is None:
            raise SignatureError("SignatureDoesNotMatch",
                                 f"a signed header is missing: {name}")
        lines.append(f"{name}:{' '.join(value.split())}\n")
    payload = hashlib.sha256(body).hexdigest()
    claimed = headers.get("X-Amz-Content-Sha256")
    if claimed is not None and claimed != payload:
        raise SignatureError("SignatureDoesNotMatch",
                             "X-Amz-Content-Sha256 is not the body's SHA-256")
    path, _, query = target.partition("?")
    key = _signing_key(cred.secret, date, region, service)
    for form in _canonical_queries(query):
        canonical = "\n".join([method, _canonical_path(path), form, "".join(lines), signed,
                               payload])
        to_sign = "\n".join([ALGORITHM, stamp, f"{date}/{region}/{service}/aws4_request",
                             hashlib.sha256(canonical.encode()).hexdigest()])
        expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if hmac.compare_digest(expected, signature):
            return cred
    raise SignatureError("SignatureDoesNotMatch",
                         "The request signature we calculated does not match the signature "
                         "you provided. Check your AWS Secret Access Key and signing method.")
