"""What the command-line adapters share: exit codes, an argument parser that reports errors
to its caller, whole-number arguments, the database URL, and one-line error messages that
never show a secret."""

from __future__ import annotations

import argparse
import os
import re
from typing import Final, NoReturn

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

__all__ = [
    "DATABASE_URL_ENV",
    "EXIT_DATABASE_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "UsageParser",
    "VersionRequested",
    "add_version",
    "database_error_line",
    "database_url",
    "first_line",
    "mask_urls",
    "whole_number",
]

EXIT_OK: Final = 0
EXIT_DATABASE_ERROR: Final = 1
EXIT_USAGE: Final = 2
DATABASE_URL_ENV: Final = "INBOX_DATABASE_URL"
_SECRET_QUERY_WORDS: Final = ("password", "passwd", "pwd", "secret", "token", "key")


class UsageError(Exception):
    """Bad command-line arguments (exit :data:`EXIT_USAGE`)."""


class VersionRequested(Exception):
    """``--version`` was given: print :attr:`line` on stdout and exit :data:`EXIT_OK`."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class _VersionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from inbox._startup import required_revision
        from inbox._version import __version__

        raise VersionRequested(
            f"{parser.prog} {__version__} (inbox schema revision {required_revision()})"
        )


def add_version(parser: argparse.ArgumentParser) -> None:
    """Add ``--version``: the package version and the schema revision it needs, raised as
    :class:`VersionRequested` before any other argument is checked."""
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="print the version and exit"
    )


class UsageParser(argparse.ArgumentParser):
    """An ArgumentParser that reports errors to its caller instead of exiting the process."""

    def error(self, message: str) -> NoReturn:
        """Raise :class:`UsageError` with argparse's message."""
        raise UsageError(message)


def whole_number(low: int, high: int | None = None) -> type[int]:
    """An argparse ``type`` accepting a base-10 whole number between ``low`` and ``high``."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse  # type: ignore[return-value]


def database_url(given: str | None) -> URL:
    """The database URL from ``--database-url`` or :data:`DATABASE_URL_ENV`; a ValueError
    that never echoes the text (it may hold the password) when it does not parse, or when
    an unescaped ``@`` makes it ambiguous."""
    text = given if given is not None else os.environ.get(DATABASE_URL_ENV)
    if not text:
        raise ValueError(f"no database: pass --database-url or set {DATABASE_URL_ENV}")
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise ValueError("--database-url is not a valid SQLAlchemy URL") from None
    if url.password is not None and "@" in _after_password(text):
        # The parser ends the password at its first '@' and takes the rest of it for the
        # host: connecting would send the password's tail to DNS and print it in the error.
        raise ValueError(
            "--database-url has an '@' after its password: percent-encode '@' as %40 in the "
            "password (and anywhere else in the URL)"
        )
    return url


def _after_password(text: str) -> str:
    """What follows the userinfo of a URL with a password: SQLAlchemy's parser takes the
    user name up to the first ':' and the password up to the next '@'."""
    authority = text.partition("://")[2]
    return authority.partition(":")[2].partition("@")[2]


# Up to the last '@' of the word: an unescaped '@' in a password must not end the mask.
_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^\s:/@]*:)\S*@")


def mask_urls(text: str) -> str:
    """``text`` with the password of every URL in it masked (argparse echoes arguments it
    did not recognise, URLs given in the wrong place included), everything up to the last
    ``@`` of the URL included."""
    return _URL_CREDENTIALS.sub(r"\g<head>***@", text)


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


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
        if any(word in name.lower() for word in _SECRET_QUERY_WORDS):
            values = [value] if isinstance(value, str) else list(value)
            secrets.extend(v for v in values if v)
            query[name] = "***"
    line = f"{message} (database {url.set(query=query).render_as_string(hide_password=True)})"
    for secret in sorted(secrets, key=len, reverse=True):
        line = line.replace(secret, "***")
    return line.replace("%2A%2A%2A", "***")
