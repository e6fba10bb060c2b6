"""The subcommands of ``inbox`` that live in other packages (``inbox console``): what one
offers (:class:`Subcommand`), found through the ``inbox.subcommands`` entry-point group. The
command imports no front end and no front end imports the command: both stand on
:mod:`inbox.operations`."""

from __future__ import annotations

import argparse
from importlib.metadata import entry_points
from typing import Final, Protocol, TextIO, runtime_checkable

from sqlalchemy import Engine

from inbox.errors import ConfigurationError
from inbox.operations._tables import Tables

__all__ = ["ENTRY_POINT_GROUP", "Subcommand", "discovered"]

ENTRY_POINT_GROUP: Final = "inbox.subcommands"
"""Where a package registers a subcommand, named as typed: ``console =
"inbox.console._command:SUBCOMMAND"`` (pyproject's ``[project.entry-points]``)."""


@runtime_checkable
class Subcommand(Protocol):
    """A subcommand of ``inbox`` that works on the inbox's database. The command gives its
    parser the database options (``--database-url``, ``--table``, ``--effect-table``,
    ``--outbox-table``) before :meth:`add_options`; it connects, looks the tables up and
    reads the broker URL (needed when the subcommand has a ``--queue`` given) before
    :meth:`run`, and prints what :meth:`run` raises as one line with its exit code. Loading
    one must import nothing heavy: ``inbox --help`` loads every subcommand."""

    help: str
    """One line for ``inbox --help``."""

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Add the subcommand's own options to ``parser``."""

    def run(
        self,
        engine: Engine,
        tables: Tables,
        args: argparse.Namespace,
        broker: str | None,
        out: TextIO,
    ) -> int:
        """Run it; return the exit code (``inbox._cli``'s). Errors propagate."""


def discovered() -> dict[str, Subcommand]:
    """The registered subcommands by name, sorted; a registration that is no
    :class:`Subcommand` is a :class:`~inbox.ConfigurationError` (a ``TypeError`` too)."""
    found: dict[str, Subcommand] = {}
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        subcommand = entry.load()
        if not isinstance(subcommand, Subcommand):
            raise ConfigurationError(
                f"{entry.value} ({ENTRY_POINT_GROUP}) is not an inbox subcommand"
            )
        found.setdefault(entry.name, subcommand)
    return found
