"""Checked dataclass families: the master's WAL records (``master/state/records.py``).

A record is a frozen dataclass registered under a code; on disk it is the msgpack array
``[code, field_1, ..., field_n]``, nested dataclasses as plain arrays of their fields. Every
field is checked against its declared type on decode, so replay only ever sees well-typed
records. The wire messages are msgspec Structs with their own codec (``codec.py``); records
stay dataclasses so that every WAL and checkpoint an older release wrote reads unchanged.
Codes are unique across the two families (``codec.claim_op``): a record's bytes name what it
is, and a network frame never decodes as a record.
"""

from __future__ import annotations

import dataclasses
import operator
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

from blizzard.wire.codec import MAX_BATCH, claim_op
from blizzard.wire.errors import ProtocolError

M = TypeVar("M")  # a record class
_NUMBER = {int, float}


class Registry:
    """A family of record classes by code; ``pack``/``unpack`` are its bytes."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.by_op: dict[int, type] = {}
        self._op_of: dict[type, int] = {}
        self._checkers: dict[type, Callable[[Any], Any]] = {}
        self._flatteners: dict[type, Callable[[Any], list[Any]]] = {}

    @typing.dataclass_transform(frozen_default=True)
    def message(self, op: int) -> Callable[[type[M]], type[M]]:
        """Class decorator: make a frozen dataclass a member with code ``op``."""

        def wrap(cls: type[M]) -> type[M]:
            cls = dataclasses.dataclass(frozen=True, slots=True)(cls)
            claim_op(op, cls)
            self.by_op[op] = cls
            self._op_of[cls] = op
            return cls

        return wrap

    def pack(self, rec: Any) -> bytes:
        """A record's bytes: ``[code, field_1, ..., field_n]``."""
        body: bytes = msgpack.packb([self._op_of[type(rec)], *self._to_fields(rec)],
                                    use_bin_type=True)
        return body

    def unpack(self, body: bytes) -> Any:
        """Inverse of ``pack``; raises ``ProtocolError`` on anything malformed."""
        try:
            raw = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
        except Exception as exc:
            raise ProtocolError(f"{self.what} is not valid msgpack: {exc}") from None
        if type(raw) is not list or not raw or type(raw[0]) is not int or raw[0] not in self.by_op:
            raise ProtocolError(f"{self.what} has no known type")
        return self._from_fields(self.by_op[raw[0]], raw[1:])

    def _from_fields(self, cls: type, values: Any) -> Any:
        try:
            return self._field_checkers(cls)(values)
        except ProtocolError as exc:
            raise ProtocolError(f"{cls.__name__}: {exc.message}") from None

    def _field_checkers(self, cls: type) -> Callable[[Any], Any]:
        checker = self._checkers.get(cls)
        if checker is None:
            hints = typing.get_type_hints(cls)
            fields = dataclasses.fields(cls)
            checks = [self._checker(hints[f.name]) for f in fields]
            count = len(fields)
            # trailing fields with defaults were added later: older records lack them
            least = sum(1 for f in fields if f.default is dataclasses.MISSING
                        and f.default_factory is dataclasses.MISSING)

            def checker(values: Any) -> Any:
                if type(values) is not list or not least <= len(values) <= count:
                    raise ProtocolError(f"{cls.__name__} takes {count} fields")
                # an older record's values stop short: the fields after take their defaults
                return cls(*[c(v) for c, v in zip(checks, values, strict=False)])

            self._checkers[cls] = checker
        return checker

    def _checker(self, tp: Any) -> Callable[[Any], Any]:
        """A function that validates (and normalises) a decoded value of type ``tp``."""
        origin = typing.get_origin(tp)
        if tp is float:
            def check_float(v: Any) -> float:
                if type(v) is float or type(v) is int:
                    return float(v)
                raise ProtocolError(f"expected a number, got {type(v).__name__}")
            return check_float
        if tp in (int, bool, str, bytes):
            def check_plain(v: Any) -> Any:
                if type(v) is not tp:
                    raise ProtocolError(f"expected {tp.__name__}, got {type(v).__name__}")
                return v
            return check_plain
        if origin is list:
            (inner,) = typing.get_args(tp)
            if inner in (int, str, bytes, float):
                allowed = _NUMBER if inner is float else {inner}

                def check_plain_list(v: Any) -> list[Any]:
                    if type(v) is not list:
                        raise ProtocolError(f"expected an array, got {type(v).__name__}")
                    if len(v) > MAX_BATCH * 4:
                        raise ProtocolError(f"array of {len(v)} elements is too long")
                    if not set(map(type, v)) <= allowed:  # one pass in C
                        bad = next(x for x in v if type(x) not in allowed)
                        raise ProtocolError(f"expected {inner.__name__} elements, got "
                                            f"{type(bad).__name__}")
                    return v
                return check_plain_list
            check_inner = self._checker(inner)

            def check_list(v: Any) -> list[Any]:
                if type(v) is not list:
                    raise ProtocolError(f"expected an array, got {type(v).__name__}")
                if len(v) > MAX_BATCH * 4:
                    raise ProtocolError(f"array of {len(v)} elements is too long")
                return [check_inner(x) for x in v]
            return check_list
        if origin in (typing.Union, types.UnionType):
            (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
            check_some = self._checker(inner)
            return lambda v: None if v is None else check_some(v)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return lambda v: self._from_fields(tp, v)
        raise TypeError(f"unsupported record field type {tp!r}")

    def _to_fields(self, rec: Any) -> list[Any]:
        cls = type(rec)
        flatten = self._flatteners.get(cls)
        if flatten is None:
            flatten = self._flatteners[cls] = self._flattener(cls)
        return flatten(rec)

    def _flattener(self, cls: type) -> Callable[[Any], list[Any]]:
        """A function listing a record's fields, nested dataclasses as plain arrays."""
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        nested = {}
        for i, name in enumerate(names):
            tp = hints[name]
            if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None
                tp = next(a for a in typing.get_args(tp) if a is not type(None))
            inner = typing.get_args(tp)[0] if typing.get_origin(tp) is list else tp
            if dataclasses.is_dataclass(inner):
                nested[i] = inner is not tp  # True: a list of records
        if not nested:
            if not names:
                return lambda rec: []
            if len(names) == 1:
                name = names[0]
                return lambda rec: [getattr(rec, name)]
            get_all = operator.attrgetter(*names)
            return lambda rec: list(get_all(rec))

        def flatten(rec: Any) -> list[Any]:
            out = [getattr(rec, name) for name in names]
            for i, many in nested.items():
                v = out[i]
                if many:
                    out[i] = [self._to_fields(x) for x in v]
                elif v is not None:
                    out[i] = self._to_fields(v)
            return out
        return flatten

    def op_of(self, cls: type) -> int:
        return self._op_of[cls]

