"""Validating a decoded body (JSON values) into a dataclass, field by field, without pydantic.

A parser is built once per dataclass at registration, from its resolved annotations: an
annotation it cannot check is a :class:`~inbox.RegistrationError` then, not a surprise at
the first message. Parsing collects every problem as ``path: what was wrong`` and never
quotes a value, so the reason can go into a dead-letter header. Keys the dataclass does not
declare are ignored, so producers can add fields before consumers know them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, Union

from inbox.errors import RegistrationError

__all__ = ["Problems", "dataclass_parser"]

Problems = list[str]
"""Where a body failed and why, as ``path: reason`` lines (no values)."""

Convert = Callable[[object, str, Problems], object]
"""Check and convert one value at ``path``; on failure append to the problems and return
:data:`_INVALID`."""

_INVALID: Final = object()
_FROM_TEXT: Final[dict[type, Callable[[str], object]]] = {
    uuid.UUID: uuid.UUID,
    dt.datetime: dt.datetime.fromisoformat,
    dt.date: dt.date.fromisoformat,
    dt.time: dt.time.fromisoformat,
    decimal.Decimal: decimal.Decimal,
}


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return type(value).__name__


def dataclass_parser(cls: type[Any]) -> Callable[[object, Problems], object]:
    """The parser of bodies into ``cls``; raises RegistrationError for an annotation that
    cannot be checked (use a pydantic model for those)."""
    convert = _Builder().dataclass(cls)

    def parse(body: object, problems: Problems) -> object:
        return convert(body, "", problems)

    return parse


class _Builder:
    """Builds converters; remembers dataclasses under construction for recursive types."""

    def __init__(self) -> None:
        self._done: dict[type, Convert] = {}

    def dataclass(self, cls: type[Any]) -> Convert:
        if cls in self._done:
            return self._done[cls]
        fields: dict[str, tuple[Convert, bool]] = {}

        def convert(value: object, path: str, problems: Problems) -> object:
            return _fill(cls, fields, value, path, problems)

        self._done[cls] = convert  # before the fields: a field may refer back to cls
        try:
            hints = typing.get_type_hints(cls)
        except Exception as exc:
            raise RegistrationError(
                f"body={cls.__qualname__}: its annotations cannot be resolved ({exc})"
            ) from exc
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            required = (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            where = f"{cls.__qualname__}.{field.name}"
            fields[field.name] = (self.annotation(hints[field.name], where), required)
        return convert

    def annotation(self, hint: Any, where: str) -> Convert:
        if hint is Any or hint is object:
            return lambda value, path, problems: value
        if hint is None or hint is type(None):
            return _exact(type(None), "null")
        if typing.get_origin(hint) is not None:
            return self._generic(hint, where)
        if not isinstance(hint, type):
            raise _cannot(hint, where)
        return self._plain(hint, where)

    def _generic(self, hint: Any, where: str) -> Convert:
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is Literal:
            return _literal(args)
        if origin in (Union, types.UnionType):
            return _union([self.annotation(arg, where) for arg in args], hint)
        if origin in (list, Sequence):
            return _sequence(self.annotation(args[0], where), list)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]
                return _sequence(self.annotation(args[0], where), tuple)
            return _fixed_tuple([self.annotation(arg, where) for arg in args])
        if origin in (dict, Mapping) and args[0] is str:
            return _mapping(self.annotation(args[1], where))
        raise _cannot(hint, where)

    def _plain(self, hint: type, where: str) -> Convert:
        if dataclasses.is_dataclass(hint):
            return self.dataclass(hint)
        if issubclass(hint, enum.Enum):
            return _enum(hint)
        if hint is bool:
            return _exact(bool, "a boolean")
        if hint in (str, bytes):
            return _exact(hint, "a string" if hint is str else "bytes")
        simple: dict[type, Convert] = {
            int: _integer,
            float: _number,
            list: _sequence(self.annotation(Any, where), list),
            tuple: _sequence(self.annotation(Any, where), tuple),
            dict: _mapping(self.annotation(Any, where)),
        }
        if hint in simple:
            return simple[hint]
        if hint in _FROM_TEXT:
            return _from_text(hint)
        raise _cannot(hint, where)


def _cannot(hint: object, where: str) -> RegistrationError:
    return RegistrationError(
        f"body type field {where} is annotated {hint!r}, which a dataclass body cannot be "
        "checked against (supported: str, int, float, bool, None, Any, UUID, datetime, "
        "date, time, Decimal, enums, Literal, unions, list, tuple, dict[str, ...], nested "
        "dataclasses); use a pydantic model for it"
    )


def _fill(
    cls: type[Any],
    fields: Mapping[str, tuple[Convert, bool]],
    value: object,
    path: str,
    problems: Problems,
) -> object:
    if not isinstance(value, Mapping):
        problems.append(f"{path or 'body'}: expected an object, got {_kind(value)}")
        return _INVALID
    arguments: dict[str, object] = {}
    before = len(problems)
    for name, (convert, required) in fields.items():
        inner = f"{path}.{name}" if path else name
        if name not in value:
            if required:
                problems.append(f"{inner}: field required")
            continue
        arguments[name] = convert(value[name], inner, problems)
    if len(problems) > before:
        return _INVALID
    try:
        return cls(**arguments)
    except (TypeError, ValueError) as exc:  # its __post_init__ refused the values
        problems.append(f"{path or 'body'}: {cls.__qualname__}() raised {type(exc).__name__}")
        return _INVALID


def _exact(kind: type, described: str) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        if type(value) is kind:
            return value
        problems.append(f"{path}: expected {described}, got {_kind(value)}")
        return _INVALID

    return convert


def _integer(value: object, path: str, problems: Problems) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    problems.append(f"{path}: expected an integer, got {_kind(value)}")
    return _INVALID


def _number(value: object, path: str, problems: Problems) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    problems.append(f"{path}: expected a number, got {_kind(value)}")
    return _INVALID


def _literal(allowed: tuple[object, ...]) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        if any(type(value) is type(a) and value == a for a in allowed):
            return value
        problems.append(f"{path}: not one of the {len(allowed)} allowed values")
        return _INVALID

    return convert


def _enum(kind: type[enum.Enum]) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        try:
            return kind(value)
        except (ValueError, TypeError):
            problems.append(f"{path}: not a value of {kind.__qualname__}")
            return _INVALID

    return convert


def _from_text(kind: type) -> Convert:
    parse = _FROM_TEXT[kind]

    def convert(value: object, path: str, problems: Problems) -> object:
        if isinstance(value, kind) and not (kind is dt.date and isinstance(value, dt.datetime)):
            return value
        if isinstance(value, str):
            try:
                return parse(value)
            except (ValueError, ArithmeticError):
                pass
        problems.append(f"{path}: expected {kind.__name__} as a string, got {_kind(value)}")
        return _INVALID

    return convert


def _union(options: list[Convert], hint: object) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        for option in options:
            tried: Problems = []
            converted = option(value, path, tried)
            if not tried:
                return converted
        shown = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        problems.append(f"{path}: expected {shown}, got {_kind(value)}")
        return _INVALID

    return convert


def _sequence(item: Convert, kind: type[list[object]] | type[tuple[object, ...]]) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, list | tuple):
            problems.append(f"{path}: expected an array, got {_kind(value)}")
            return _INVALID
        items = [item(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
        return kind(items)

    return convert


def _fixed_tuple(items: list[Convert]) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, list | tuple) or len(value) != len(items):
            problems.append(f"{path}: expected an array of {len(items)}, got {_kind(value)}")
            return _INVALID
        return tuple(
            c(v, f"{path}[{i}]", problems)
            for i, (c, v) in enumerate(zip(items, value, strict=True))
        )

    return convert


def _mapping(item: Convert) -> Convert:
    def convert(value: object, path: str, problems: Problems) -> object:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            problems.append(f"{path}: expected an object with string keys, got {_kind(value)}")
            return _INVALID
        # Keys are data: the path names the position, not the key.
        return {k: item(v, f"{path}{{}}", problems) for k, v in value.items()}

    return convert
