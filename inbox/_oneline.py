"""Errors as one bounded line for logs and headers, without SQL text or bound parameters.

SQLAlchemy renders a database error as several lines: the driver's message, the SQL, the
bound parameters (row data: names, addresses) and a link. An operator needs the error's class
and the driver's first line; the rest stays out of every log line and every header.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from sqlalchemy.engine import URL
from sqlalchemy.exc import StatementError

__all__ = ["MAX_LINE", "SECRET_QUERY_WORDS", "bounded", "database_error_line", "describe_error"]

MAX_LINE: Final = 500
"""The default bound, in characters, of a described error."""

_REDACTED: Final = "***"
_MIN_SECRET: Final = 3  # shorter parameter values would redact ordinary words and numbers
_MIN_NUMBER: Final = 6  # error codes and small counts stay readable
_MAX_VALUES: Final = 1000  # an executemany's parameters: enough to check, not all of them
# A quoted stretch of a driver's message, where drivers echo the value they refused.
_QUOTED: Final = re.compile(r"'([^']{3,})'|\"([^\"]{3,})\"")
_LINE_BREAKS: Final = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]+")


def describe_error(exc: BaseException, *, limit: int = MAX_LINE) -> str:
    """``ExceptionType: first line of its message``, on one line of at most ``limit``
    characters. For a database error (a SQLAlchemy ``StatementError``) the message is the
    driver's first line, without the SQL, and any bound parameter value the driver echoed in
    it is replaced by ``***``."""
    if isinstance(exc, StatementError):
        orig = exc.orig
        text = _first_line(orig if orig is not None else (exc.args[0] if exc.args else ""))
        text = _redact(text, exc.params)
    else:
        text = _first_line(str(exc))
    name = type(exc).__name__
    return bounded(f"{name}: {text}" if text else name, limit)


def bounded(text: str, limit: int = MAX_LINE) -> str:
    """``text`` on one line (line breaks become `` | ``), cut to ``limit`` characters with
    the cut marked."""
    line = _LINE_BREAKS.sub(" | ", text.strip())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _first_line(text: object) -> str:
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else ""


def _redact(text: str, params: object) -> str:
    values = sorted(
        {v for v in _string_values(params) if len(v) >= _MIN_SECRET}, key=len, reverse=True
    )
    if not values:
        return text
    for value in values:
        text = text.replace(value, _REDACTED)

    # Drivers cut long values short in their messages: a quoted part of a value goes too.
    def quoted(match: re.Match[str]) -> str:
        inner = match.group(1) or match.group(2)
        hit = any(inner in v for v in values)
        return match.group(0).replace(inner, _REDACTED) if hit else match.group(0)

    return _QUOTED.sub(quoted, text)


def _string_values(params: object, depth: int = 0) -> Iterator[str]:
    """The text of every bound value in ``params`` (a mapping, a sequence of them, or a
    tuple), as far as the first :data:`_MAX_VALUES`."""
    stack: list[tuple[object, int]] = [(params, depth)]
    seen = 0
    while stack and seen < _MAX_VALUES:
        value, level = stack.pop()
        if isinstance(value, str):
            seen += 1
            yield value
        elif isinstance(value, bytes | bytearray):
            seen += 1
            yield bytes(value).decode("utf-8", "replace")
        elif isinstance(value, dict) and level < 3:
            stack.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list | tuple) and level < 3:
            stack.extend((v, level + 1) for v in value)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            text = str(value)
            if len(text) >= _MIN_NUMBER:
                seen += 1
                yield text
        elif value is not None and not isinstance(value, bool):
            seen += 1
            yield str(value)


SECRET_QUERY_WORDS: Final = ("password", "passwd", "pwd", "secret", "token", "key")
"""A URL query parameter whose name holds one of these carries a secret: never printed."""


def database_error_line(exc: BaseException, url: URL) -> str:
    """The first line of a database error and the database it came from, with every secret
    of the URL masked wherever it appears."""
    orig = getattr(exc, "orig", None)  # the driver's error, without SQLAlchemy's SQL dump
    lines = str(orig if orig is not None else exc).strip().splitlines()
    message = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    secrets = [str(url.password)] if url.password else []
    if url.host and "@" in url.host:  # the tail of a password with an unescaped '@'
        secrets.extend(part for part in url.host.split("@")[:-1] if part)
    query = dict(url.query)
    for name, value in url.query.items():
        if any(word in name.lower() for word in SECRET_QUERY_WORDS):
            values = [value] if isinstance(value, str) else list(value)
            secrets.extend(v for v in values if v)
            query[name] = "***"
    line = f"{message} (database {url.set(query=query).render_as_string(hide_password=True)})"
    for secret in sorted(secrets, key=len, reverse=True):
        line = line.replace(secret, "***")
    return line.replace("%2A%2A%2A", "***")
