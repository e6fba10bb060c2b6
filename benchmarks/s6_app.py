"""The application S6 runs in ``inbox-worker``: one handler that inserts one row per message.

    S6_DATABASE_URL=postgresql+psycopg://...?options=-csearch_path%3Dbench_x \\
        inbox-worker s6_app:make_inbox --queue ...      (from benchmarks/)

The database URL comes from ``S6_DATABASE_URL`` (S6 points it at a fresh schema that holds
the inbox table and S1's business tables; the handler is S1's one-row insert).
"""

from __future__ import annotations

import os
from typing import Final

from s1_overhead import business, one_statement
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker

from inbox import Inbox

DATABASE_URL_ENV: Final = "S6_DATABASE_URL"
HANDLER: Final = "bench.s6_insert"
MESSAGE_TYPE: Final = "bench"

__all__ = ["DATABASE_URL_ENV", "MESSAGE_TYPE", "business", "make_inbox"]


def make_inbox() -> Inbox:
    """The inbox ``inbox-worker s6_app:make_inbox`` runs, on ``$S6_DATABASE_URL``."""
    url = os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ValueError(f"set {DATABASE_URL_ENV} to the database URL")
    box = Inbox(sessionmaker(create_engine(url)))
    box.handler(MESSAGE_TYPE, name=HANDLER)(one_statement)
    return box
