"""The application S6 runs in ``inbox-worker``: one handler that inserts one row per message.

    S6_DATABASE_URL=postgresql+psycopg://...?options=-csearch_path%3Dbench_x \\
        inbox-worker s6_app:make_inbox --queue ...      (from benchmarks/)

The database URL comes from ``S6_DATABASE_URL`` (S6 points it at a fresh schema that holds
the inbox table and ``bench_order``).
"""

from __future__ import annotations

import os
from typing import Final

from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, create_engine, insert
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message

DATABASE_URL_ENV: Final = "S6_DATABASE_URL"
HANDLER: Final = "bench.s6_insert"
MESSAGE_TYPE: Final = "bench"

business = MetaData()
orders = Table(
    "bench_order",
    business,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("ref", BigInteger, nullable=False),
    Column("amount", Integer, nullable=False),
)
INSERT_ORDER = insert(orders)


def insert_order(message: Message, session: Session) -> None:
    """Insert one row."""
    session.execute(INSERT_ORDER, {"ref": message.body["ref"], "amount": message.body["amount"]})


def make_inbox() -> Inbox:
    """The inbox ``inbox-worker s6_app:make_inbox`` runs, on ``$S6_DATABASE_URL``."""
    url = os.environ.get(DATABASE_URL_ENV)
    if not url:
        raise ValueError(f"set {DATABASE_URL_ENV} to the database URL")
    box = Inbox(sessionmaker(create_engine(url)))
    box.handler(MESSAGE_TYPE, name=HANDLER)(insert_order)
    return box
