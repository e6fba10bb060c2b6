"""PostgreSQL: its knowledge (``_family``), its claim statements (``_claims``), and one
module per driver where the drivers differ: psycopg 3 with libpq pipelining (``_psycopg``,
``_libpq``), psycopg2 (``_psycopg2``), asyncpg (``_asyncpg``); pg8000 takes the generic backend."""

from inbox._backends.postgresql._family import PostgreSQLFamily

__all__ = ["FAMILY"]

FAMILY = PostgreSQLFamily()
"""The PostgreSQL family, as registered in :mod:`inbox._backends._registry`."""
