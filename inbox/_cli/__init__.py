"""What the command-line adapters share: exit codes, an argument parser that reports errors
to its caller, whole-number arguments, the database URL, and one-line error messages that
never show a secret."""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
from typing import Any, Final, NoReturn, TextIO, cast

from sqlalchemy import URL, make_url
from sqlalchemy.exc import ArgumentError

from inbox._oneline import SECRET_QUERY_WORDS as _SECRET_QUERY_WORDS
from inbox.errors import ConfigurationError

__all__ = [
    "DATABASE_URL_ENV",
    "EXIT_DATABASE_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "OutputClosed",
    "UsageError",
    "UsageParser",
    "VersionRequested",
    "add_version",
    "database_url",
    "first_line",
    "mask_urls",
    "pipe_safe",
    "printable_url",
    "quiet_closed_stdout",
    "unmigrated",
    "usage_line",
    "whole_number",
]

EXIT_OK: Final = 0
EXIT_DATABASE_ERROR: Final = 1
EXIT_USAGE: Final = 2
DATABASE_URL_ENV: Final = "INBOX_DATABASE_URL"


class UsageError(Exception):
    """Bad command-line arguments (exit :data:`EXIT_USAGE`); ``prog``: the (sub)command whose
    ``--help`` explains them, when known."""

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog


def usage_line(prog: str, exc: BaseException) -> str:
    """The one line a usage error prints: what is wrong, secrets masked, and, for an error
    the parser found, where the usage is (argparse would print its whole usage block)."""
    command = getattr(exc, "prog", None)
    hint = f" (see {command} --help)" if command else ""
    return f"{prog}: error: {mask_urls(str(exc))}{hint}\n"


class VersionRequested(Exception):
    """``--version`` was given: print :attr:`line` on stdout and exit :data:`EXIT_OK`."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class _VersionAction(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        from inbox._version import __version__
        from inbox.core._startup import required_revision

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
    """An ArgumentParser that reports errors to its caller instead of exiting the process,
    and takes no abbreviation of a long option (``--token`` is never ``--token-file``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Raise :class:`UsageError` with argparse's message and this parser's ``prog``."""
        raise UsageError(message, self.prog)


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
        raise ConfigurationError(f"no database: pass --database-url or set {DATABASE_URL_ENV}")
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise ConfigurationError("--database-url is not a valid SQLAlchemy URL") from None
    if url.password is not None and "@" in _after_password(text):
        # The parser ends the password at its first '@' and takes the rest of it for the
        # host: connecting would send the password's tail to DNS and print it in the error.
        raise ConfigurationError(
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
# A query parameter whose name says it holds a secret (?password=, &sslpassword=, ?token=…).
_SECRET_QUERY = re.compile(
    r"(?P<head>[?&;][^=&;#\s]*(?:" + "|".join(_SECRET_QUERY_WORDS) + r")[^=&;#\s]*=)"
    r"[^&;#\s]*",
    re.IGNORECASE,
)


def mask_urls(text: str) -> str:
    """``text`` with the password of every URL in it masked (argparse echoes arguments it
    did not recognise, URLs given in the wrong place included), everything up to the last
    ``@`` of the URL included, and the value of every query parameter whose name holds
    ``password``, ``secret``, ``token``, ``key``… (``?sslpassword=``, ``&api_key=``)."""
    return _SECRET_QUERY.sub(r"\g<head>***", _URL_CREDENTIALS.sub(r"\g<head>***@", text))


def printable_url(url: URL) -> str:
    """``url`` as it may be printed: the password and every secret-bearing query parameter
    masked."""
    query = {
        name: ("***" if any(word in name.lower() for word in _SECRET_QUERY_WORDS) else value)
        for name, value in url.query.items()
    }
    text = url.set(query=query).render_as_string(hide_password=True)
    return mask_urls(text.replace("%2A%2A%2A", "***"))


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class OutputClosed(Exception):
    """The command's standard output was closed by its reader (``inbox status | head -1``)."""


class _PipeSafe(io.TextIOBase):
    """A text stream that reports a closed pipe as :class:`OutputClosed`, so that it cannot
    be taken for a broken connection to the database or the broker."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise OutputClosed from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise OutputClosed from None

    def isatty(self) -> bool:
        return self._stream.isatty()


def pipe_safe(stream: TextIO) -> TextIO:
    """``stream``, raising :class:`OutputClosed` instead of ``BrokenPipeError``."""
    return cast(TextIO, _PipeSafe(stream))


def quiet_closed_stdout() -> None:
    """After :class:`OutputClosed`: point the process's standard output at ``/dev/null``, so
    that the interpreter's last flush at exit does not fail on the closed pipe again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real stdout (a test's StringIO): nothing to quiet
        pass


# The table's name in each family's message for a table that is not there (which error that
# is, each family knows: _backends/).
_MISSING_TABLE = re.compile(
    r"no such table: (?P<sqlite>\S+)|relation \"(?P<pg>[^\"]+)\" does not exist"
    r"|Table '(?P<mysql>[^']+)' doesn't exist"
)


def unmigrated(exc: BaseException) -> str | None:
    """When ``exc`` says a table does not exist: one line naming it and the migrations to
    run (``inbox status`` on a database nobody migrated); else None."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return None
    from inbox._backends import is_missing_table

    if not is_missing_table(orig):
        return None
    from inbox.core._startup import MIGRATE_HINT

    found = _MISSING_TABLE.search(str(orig))
    name = next((n for n in found.groups() if n), None) if found else None
    table = f"table {name}" if name else "a table"
    return f"{table} does not exist: the database lacks the inbox's tables; {MIGRATE_HINT}"
