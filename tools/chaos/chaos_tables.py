"""The chaos ledger's business table, shared by the harness and the worker app."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, Table

metadata = MetaData()
effects = Table(
    "chaos_effect",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Not unique on purpose: a doubled effect must be counted, not refused.
    Column("op", Integer, nullable=False, index=True),
    Column("pid", Integer, nullable=False),
)
