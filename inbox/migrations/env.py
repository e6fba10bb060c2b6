"""Alembic environment for the inbox's own revisions (see alembic.ini).

The URL comes from INBOX_DATABASE_URL (default: a SQLite file in the working directory).
The version table is ``inbox_alembic_version``, so running these migrations against an
application database never touches the application's own ``alembic_version``.
"""

import os
from logging.config import fileConfig

from sqlalchemy import create_engine, pool

from alembic import context
from inbox.schema import metadata

DEFAULT_URL = "sqlite:///inbox.db"
VERSION_TABLE = "inbox_alembic_version"

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# A str or a sqlalchemy URL object: passed on as it is (str() of a URL masks its password).
url = config.attributes.get("url") or os.environ.get("INBOX_DATABASE_URL") or DEFAULT_URL
target_metadata = metadata


def only_inbox_tables(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate looks at the inbox's tables only, never at the application's."""
    return type_ != "table" or name in target_metadata.tables


def run_migrations_offline() -> None:
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = create_engine(url, poolclass=pool.NullPool)
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            include_name=only_inbox_tables,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
