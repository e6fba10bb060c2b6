"""The ``inbox`` command's audit lines: each change it makes (``dlq replay|purge|archive``,
``release``) appended to the audit file the console writes and reads
(:mod:`inbox.operations._audit_trail`), when one is given (``--audit-file`` or
``$INBOX_AUDIT_FILE``), as the user running the command. A dry run changes nothing and
writes no line."""

from __future__ import annotations

import argparse
import getpass
import os
from collections.abc import Mapping

from inbox._cli import UsageError
from inbox.operations._audit_trail import AUDIT_FILE_ENV, append_record

__all__ = ["add_audit_option", "audit_file_of", "check_audit_file", "os_user", "record"]


def add_audit_option(parser: argparse.ArgumentParser) -> None:
    """The ``--audit-file`` option of a command that changes something."""
    parser.add_argument(
        "--audit-file",
        metavar="FILE",
        help="append an audit line of what was done to FILE, as inbox console --audit-file "
        f"does (default ${AUDIT_FILE_ENV}; its audit page reads it back)",
    )


def audit_file_of(args: argparse.Namespace) -> str | None:
    """The audit file the command writes to: ``--audit-file``, else ``$INBOX_AUDIT_FILE``,
    else None (no audit line)."""
    given: str | None = getattr(args, "audit_file", None)
    return given or os.environ.get(AUDIT_FILE_ENV) or None


def check_audit_file(args: argparse.Namespace) -> None:
    """Fail before changing anything when the audit file cannot be appended to."""
    path = audit_file_of(args)
    if path is None:
        return
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"cannot open the audit file {path}: {exc.strerror}") from None


def os_user() -> str:
    """Who runs the command (``-`` when unknown): the archive's ``archived_by`` and the
    audit line's ``who``."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no such uid in the password database
        return "-"


def record(
    args: argparse.Namespace, action: str, count: int, details: Mapping[str, object]
) -> None:
    """Append the audit line of ``action`` (done to ``count`` things) when the command has an
    audit file; ``via=inbox`` tells it from the console's lines."""
    path = audit_file_of(args)
    if path is not None:
        append_record(path, os_user(), action, count, {**details, "via": "inbox"})
