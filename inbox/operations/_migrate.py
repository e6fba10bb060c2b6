"""``inbox migrate``: the shipped revisions applied from the installed package, for an
application that has no alembic history of its own (one that has adds them to it instead,
docs/migrations.md). The same as ``alembic upgrade head`` with the repository's
``alembic.ini``: the environment ``inbox:migrations``, the version table
``inbox_alembic_version``."""

from __future__ import annotations

from collections.abc import Iterator

from alembic import command
from alembic.config import Config
from sqlalchemy import URL, Engine

from inbox._cli import UsageError
from inbox.core._startup import (
    APP_VERSION_TABLE,
    INBOX_VERSION_TABLE,
    _recorded,
    inbox_revisions,
    required_revision,
)

__all__ = ["SCRIPT_LOCATION", "migrate"]

SCRIPT_LOCATION = "inbox:migrations"
"""The alembic ``script_location`` of the shipped environment and revisions."""


def migrate(engine: Engine, url: URL, revision: str = "head") -> Iterator[str]:
    """Upgrade the database at ``url`` (``engine`` reads its version tables) to ``revision``
    of the inbox branch; yield what was done, one line each. Refuses a database whose inbox
    tables an application history (``alembic_version``) already manages."""
    known = inbox_revisions()
    if any(r in known for r in _recorded(engine, APP_VERSION_TABLE, None)):
        raise UsageError(
            f"the inbox revisions of this database are in its own alembic history "
            f"({APP_VERSION_TABLE}): run `alembic upgrade heads` there (docs/migrations.md)"
        )
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    before = _current(engine, known)
    command.upgrade(config, revision)
    after = _current(engine, known)
    target = after or "base"
    if before == after:
        yield f"inbox migrate: already at inbox revision {target} (the head is {known[0]})"
    else:
        was = f"inbox revision {before}" if before else "no inbox revision"
        yield f"inbox migrate: upgraded from {was} to inbox revision {target}"
    if after != required_revision():
        yield f"inbox migrate: this version of inbox needs {required_revision()}"


def _current(engine: Engine, known: tuple[str, ...]) -> str | None:
    """The inbox revision the database records in ``inbox_alembic_version``, if any."""
    found = [r for r in _recorded(engine, INBOX_VERSION_TABLE, None) if r in known]
    return found[0] if found else None
