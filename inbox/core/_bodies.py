"""Typed message bodies: a handler's ``body=`` type checked against a decoded body, and a
typed body turned back into JSON values for publishing.

A ``body=`` type is a dataclass (checked by :mod:`inbox.core._dataclass_bodies`) or a pydantic
model or pydantic dataclass (checked by pydantic, which is imported only if the application
already did). Nothing here imports kombu.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

from inbox.core._dataclass_bodies import Problems, dataclass_parser
from inbox.errors import RegistrationError

__all__ = ["BodyParser", "BodyRejected", "body_parser", "plain_body"]

BodyParser = Callable[[object], object]
"""Return the body as the handler's type, or raise :class:`BodyRejected`."""

_SHOWN: Final = 3  # problems named in a reason; the rest are counted
_REASON_MAX: Final = 300


class BodyRejected(Exception):
    """A body that does not validate; ``reason`` names fields and faults, never values."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def body_parser(body_type: object) -> BodyParser:
    """The parser for the ``body=`` option, built once at registration; RegistrationError
    for a type that is neither a dataclass nor a pydantic model."""
    if not isinstance(body_type, type):
        raise RegistrationError(
            f"body= must be a dataclass or a pydantic model class, got {body_type!r}"
        )
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and hasattr(body_type, "__pydantic_validator__"):
        return _pydantic_parser(pydantic, body_type)
    if dataclasses.is_dataclass(body_type):
        parse = dataclass_parser(body_type)

        def parse_dataclass(body: object) -> object:
            problems: Problems = []
            try:
                value = parse(body, problems)
            except RecursionError:  # a recursive dataclass and a body nested past the stack
                raise BodyRejected("body: nested too deeply to check") from None
            if problems:
                raise BodyRejected(_reason(problems))
            return value

        return parse_dataclass
    raise RegistrationError(
        f"body= must be a dataclass or a pydantic model class, got {body_type.__qualname__}"
    )


def _pydantic_parser(pydantic: Any, body_type: type[Any]) -> BodyParser:
    if isinstance(body_type, type) and issubclass(body_type, pydantic.BaseModel):
        validate: Callable[[object], object] = body_type.model_validate
    else:  # a pydantic dataclass
        validate = pydantic.TypeAdapter(body_type).validate_python

    def parse_pydantic(body: object) -> object:
        try:
            return validate(body)
        except pydantic.ValidationError as exc:
            errors = exc.errors(include_url=False, include_input=False, include_context=False)
            raise BodyRejected(
                _reason([f"{_location(e['loc'])}: {e['msg']}" for e in errors])
            ) from None

    return parse_pydantic


def _location(loc: tuple[int | str, ...]) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    return text.lstrip(".") or "body"


def _reason(problems: Problems) -> str:
    shown = "; ".join(problems[:_SHOWN])
    if len(problems) > _SHOWN:
        shown += f" (and {len(problems) - _SHOWN} more)"
    return shown if len(shown) <= _REASON_MAX else shown[: _REASON_MAX - 3] + "..."


def plain_body(body: object) -> object:
    """``body`` as JSON values: a dataclass instance through :func:`dataclasses.asdict`
    (UUIDs, dates, times and decimals as strings, enums as their values, tuples as lists), a
    pydantic model through ``model_dump(mode="json")``; any other body as it is.

    What :class:`inbox.broker.Publisher` and the outbox call before encoding a body, so a
    handler's ``body=`` type can be published as it is.
    """
    if dataclasses.is_dataclass(body) and not isinstance(body, type):
        return _json_ready(dataclasses.asdict(body))
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(body, pydantic.BaseModel):
        dumped: object = body.model_dump(mode="json")
        return dumped
    return body


def _json_ready(value: object) -> object:
    if isinstance(value, Mapping):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, enum.Enum):
        return _json_ready(value.value)
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    return value
