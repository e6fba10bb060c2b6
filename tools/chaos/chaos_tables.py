"""The chaos ledger's business tables, shared by the harness and the worker app: one row per
committed operation, and (the outbox stage) one per committed follow-up, with the follow-up
inbox's own claim table."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, Table

from inbox.schema import inbox_table

FOLLOWUP_CLAIMS = "chaos_followup_claim"

metadata = MetaData()
effects = Table(
    "chaos_effect",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Not unique on purpose: a doubled effect must be counted, not refused.
    Column("op", Integer, nullable=False, index=True),
    Column("pid", Integer, nullable=False),
)
followups = Table(
    "chaos_followup",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("op", Integer, nullable=False, index=True),  # not unique either
    Column("pid", Integer, nullable=False),
)
followup_claims = inbox_table(metadata, FOLLOWUP_CLAIMS)
