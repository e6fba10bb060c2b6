"""The floor under the inbox's per-message cost on PostgreSQL + psycopg 3: how much of it is
the driver, the claim's round trip, SQLAlchemy, and the inbox itself (issue 22).

    .venv/bin/python benchmarks/floor.py [--messages 2000] [--rounds 7] [--synchronous-commit off]

Every variant writes one row per message in its own transaction, alternated round by round
in one process (the order rotates), so that the machine's noise hits them alike; the table
gives the median µs per message and each variant's difference to the raw driver:

* ``raw``: psycopg alone, ``BEGIN; INSERT; COMMIT`` (the BEGIN psycopg's own);
* ``raw + claim, own round trip``: the prepared claim as a statement of its own;
* ``raw + claim, pipelined``: ``BEGIN`` and the prepared claim in one round trip on the libpq
  connection, as the inbox sends them (``inbox/_backends/postgresql/_libpq.py``);
* ``core + claim``: SQLAlchemy Core, ``engine.begin()``, the claim then the insert;
* ``session``: the plain ORM ``Session`` transaction (what S1 calls plain-1);
* ``inbox``: ``Inbox.process`` with the same one-row handler;
* ``select-1``: one ``SELECT 1`` through a session (in an open transaction), the price of
  one round trip: the unit S1 counts in.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from common import DEFAULT_DATABASE, RESULTS, fresh_schema, stamp
from sqlalchemy import Engine, event, text
from sqlalchemy.orm import Session, sessionmaker

from inbox import Inbox, Message, Outcome
from inbox._backends import Claims
from inbox._backends._waits import drive
from inbox._backends.postgresql import FAMILY as POSTGRESQL
from inbox._backends.postgresql._libpq import ClaimText, begin_and_claim
from inbox._backends.postgresql._psycopg import PsycopgBackend
from inbox.schema import inbox_message

VARIANTS = (
    "raw",
    "raw + claim, own round trip",
    "raw + claim, pipelined",
    "core + claim",
    "session",
    "inbox",
    "select-1",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--synchronous-commit", choices=["on", "off"], default="off")
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args(argv)
    from s1_overhead import business, one_statement

    with fresh_schema(options.database_url, business) as engine:
        if options.synchronous_commit == "off":
            event.listen(engine, "connect", _without_synchronous_commit)
            engine.dispose()
        samples = measure(engine, options.messages, options.rounds, one_statement)
    base = statistics.median(samples["raw"])
    print(f"floor on PostgreSQL + psycopg 3, {options.messages} messages x {options.rounds} rounds")
    print(f"{'variant':32} {'median us/msg':>14} {'min':>8} {'+ over raw':>11}")
    for name in VARIANTS:
        median = statistics.median(samples[name])
        print(f"{name:32} {median:14.1f} {min(samples[name]):8.1f} {median - base:+11.1f}")
    session, inbox, unit = (statistics.median(samples[k]) for k in ("session", "inbox", "select-1"))
    print(f"inbox - session: {inbox - session:+.1f} us = {(inbox - session) / unit:.2f} SELECT 1")
    path = options.json or RESULTS / f"floor-{stamp()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"options": vars(options) | {"json": str(path)}, "samples": samples}, indent=2)
    )
    print(f"JSON: {path}")
    return 0


def measure(
    engine: Engine, messages: int, rounds: int, handler: Callable[[Message, Session], None]
) -> dict[str, list[float]]:
    pooled = engine.raw_connection()  # the driver's connection, held for the raw variants
    raw: psycopg.Connection[Any] = pooled.driver_connection  # type: ignore[assignment]
    cursor = raw.cursor()
    insert_row = "INSERT INTO bench_order (ref, amount) VALUES (%(ref)s, %(amount)s)"
    claims = Claims(inbox_message)
    claim_sql = PsycopgBackend()._render(claims, None)
    sessions = sessionmaker(engine)
    inbox = Inbox(sessions)
    inbox.handler("bench", name="bench.one_statement")(handler)
    refs = iter(range(10**12))

    def params() -> dict[str, object]:
        return {"ref": next(refs), "amount": 7}

    def claim_params() -> dict[str, object]:
        return {
            "message_id": uuid.uuid4().bytes,
            "handler": "h",
            "processed_at": dt.datetime.now(dt.UTC),
        }

    claim_pyformat = str(claims.statements(POSTGRESQL).one.compile(dialect=engine.dialect))

    def raw_plain() -> None:
        cursor.execute(insert_row, params())
        raw.commit()

    def raw_own_trip() -> None:
        cursor.execute(claim_pyformat, claim_params(), prepare=True)
        cursor.execute(insert_row, params())
        raw.commit()

    prepared = [False]

    def raw_pipelined() -> None:
        pgconn = raw.pgconn
        row = (uuid.uuid4().bytes, b"h", dt.datetime.now(dt.UTC).isoformat().encode())
        protocol = begin_and_claim(
            pgconn, b"BEGIN", ClaimText(claim_sql.sql, b"floor_claim"), row, parse=not prepared[0]
        )
        drive(protocol, pgconn.socket)
        prepared[0] = True
        cursor.execute(insert_row, params())
        raw.commit()

    from s1_overhead import INSERT_ORDER

    def core() -> None:
        with engine.begin() as connection:
            connection.execute(claims.statements(POSTGRESQL).one, claim_params())
            connection.execute(INSERT_ORDER, params())

    def session() -> None:
        with sessions() as s, s.begin():
            s.execute(INSERT_ORDER, params())

    def through_inbox() -> None:
        if inbox.process(Message.new("bench", params())).outcome is not Outcome.PROCESSED:
            raise AssertionError("not processed")

    select_session = sessions()
    select_session.begin()

    def select_one() -> None:  # one statement of a long transaction, as S1's unit
        select_session.execute(text("SELECT 1")).scalar_one()

    steps = dict(
        zip(
            VARIANTS,
            (raw_plain, raw_own_trip, raw_pipelined, core, session, through_inbox, select_one),
            strict=True,
        )
    )
    for step in steps.values():
        for _ in range(200):
            step()
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_number in range(rounds):
        names = list(VARIANTS)
        names = names[round_number % len(names) :] + names[: round_number % len(names)]
        for name in names:
            step = steps[name]
            started = time.perf_counter()
            for _ in range(messages):
                step()
            samples[name].append((time.perf_counter() - started) / messages * 1e6)
    select_session.close()
    pooled.close()
    return samples


def _without_synchronous_commit(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute("SET synchronous_commit = off")
    cursor.close()
    dbapi_connection.commit()  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
