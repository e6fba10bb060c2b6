"""The alembic environment of the shipped revisions (``script_location = inbox:migrations``):
what ``inbox migrate``, the repository's ``alembic.ini`` and an application's two-line
``alembic.ini`` run. Alembic executes this file; it is not imported.

The URL is the ``url`` attribute of the alembic ``Config`` (a string or a SQLAlchemy ``URL``,
whose password is kept), else ``INBOX_DATABASE_URL``, else ``sqlite:///inbox.db`` in the
working directory. The version table is ``inbox_alembic_version``, so running these revisions
against an application database never touches the application's own ``alembic_version``.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

from inbox.core._startup import INBOX_VERSION_TABLE as VERSION_TABLE
from inbox.schema import metadata

DEFAULT_URL = "sqlite:///inbox.db"

config = context.config
# An application's minimal alembic.ini has no logging sections: nothing to configure then.
if (
    config.config_file_name is not None
    and config.attributes.get("configure_logger", True)
    and config.file_config.has_section("formatters")
):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

url = config.attributes.get("url") or os.environ.get("INBOX_DATABASE_URL") or DEFAULT_URL


def only_inbox_tables(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate looks at the inbox's tables only, never at the application's."""
    return type_ != "table" or name in metadata.tables


def run_migrations_offline() -> None:
    """``--sql``: the statements printed, not run."""
    context.configure(
        url=url, target_metadata=metadata, literal_binds=True, version_table=VERSION_TABLE
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """The revisions run on one connection."""
    connectable = create_engine(url, poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            version_table=VERSION_TABLE,
            include_name=only_inbox_tables,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
