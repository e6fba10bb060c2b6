"""``assert_idempotent``: prove a message's handlers are safe to redeliver.

The message goes through the inbox's real ``process()`` several times over, each time from
the database as it was when the assertion was called: once cleanly (the reference), twice in
a row, and, per handler that takes it, redelivered after a failure injected once the handler
had run and after a simulated crash before its commit (see :mod:`inbox.testing._scenarios`).
Where a run leaves the chosen tables different from the clean run, the assertion fails with
the rows that differ. The steps do no I/O; :mod:`inbox.testing._drive` runs them blocking
or awaited.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Collection, Generator, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy import Table

from inbox.core import Inbox
from inbox.core._registration import AnyInbox
from inbox.errors import ConfigurationError, InboxError
from inbox.message import Message
from inbox.schema import outbox_message
from inbox.testing._drive import async_engines_of, drive, drive_async, engines_of
from inbox.testing._scenarios import Deliver, OnDatabase, Step, scenarios
from inbox.testing._snapshot import Database, Snapshot
from inbox.testing.fakes import FakeProvider, live_providers

if TYPE_CHECKING:
    from inbox.aio import AsyncInbox

__all__ = ["NotIdempotent", "assert_idempotent", "assert_idempotent_async"]

_ROWS_SHOWN: Final = 10


class NotIdempotent(InboxError, AssertionError):
    """A redelivery left the database different from one clean run of the message."""


def assert_idempotent(
    inbox: Inbox,
    message: Message,
    *,
    tables: Sequence[str | Table],
    ignore_columns: Collection[str] = (),
) -> None:
    """Fail with a readable diff unless every way ``message`` can be redelivered leaves
    ``tables`` as one clean run of it does.

    The runs: one clean delivery (the reference); two in a row; and for each handler that
    takes the message, a redelivery after a failure injected once the handler had run (its
    transaction rolls back) and a redelivery after a simulated crash before its commit (the
    handlers after it do not run until the redelivery). Each starts from the database as it
    was at the call, every table of it put back; ``ignore_columns`` (``"table.column"``)
    are left out of the comparison (timestamps, random ids). The database is left as the
    clean run left it.

    Handlers run for real, through ``inbox.process``: writes outside the inbox's session
    (another connection, another engine on the same database) are seen, and are what this
    catches. So are calls to an outside API that a handler makes directly instead of through
    ``inbox.effect``, when a :class:`~inbox.testing.FakeProvider` stands in for that API: a
    redelivery that calls it more often than the clean run fails the assertion. An outbox
    table among ``tables`` is compared without its ``id``, ``created_at`` and
    ``available_at`` and without the trace context in its headers, which every publish sets
    anew. Needs a database of its own for the test (the ``inbox_database`` fixture). For an
    ``AsyncInbox``, ``await assert_idempotent_async(...)``.
    """
    __tracebackhide__ = True
    if not isinstance(inbox, Inbox):
        raise ConfigurationError(
            f"assert_idempotent() takes an inbox.Inbox, got {type(inbox).__name__} "
            "(for an AsyncInbox: await assert_idempotent_async(...))"
        )
    _check(inbox, message)
    engines = engines_of(inbox)
    drive(inbox, message, engines, _flow(inbox, message, tables, ignore_columns, len(engines)))


async def assert_idempotent_async(
    inbox: AsyncInbox,
    message: Message,
    *,
    tables: Sequence[str | Table],
    ignore_columns: Collection[str] = (),
) -> None:
    """:func:`assert_idempotent` for an :class:`~inbox.aio.AsyncInbox`, awaited."""
    __tracebackhide__ = True
    from inbox.aio import AsyncInbox

    if not isinstance(inbox, AsyncInbox):
        raise ConfigurationError(
            f"assert_idempotent_async() takes an inbox.aio.AsyncInbox, got "
            f"{type(inbox).__name__} (for an Inbox: assert_idempotent(...))"
        )
    _check(inbox, message)
    engines = await async_engines_of(inbox)
    flow = _flow(inbox, message, tables, ignore_columns, len(engines))
    await drive_async(inbox, message, engines, flow)


def _check(inbox: AnyInbox, message: object) -> None:
    if not isinstance(message, Message):
        raise ConfigurationError(
            f"assert_idempotent() takes an inbox.Message, got {type(message).__name__}"
        )
    if not inbox._registry.for_type(message.type):
        raise ConfigurationError(
            f"no handler of this inbox takes messages of type {message.type!r}: nothing to check"
        )


def _flow(
    inbox: AnyInbox,
    message: Message,
    tables: Sequence[str | Table],
    ignore_columns: Collection[str],
    databases: int,
) -> Generator[Step, Any, None]:
    __tracebackhide__ = True
    schemas = (None, inbox.table.schema)
    found: list[Database] = []
    for index in range(databases):
        found.append((yield OnDatabase(index, functools.partial(Database, schemas=schemas))))
    main = found[0]
    compared = _compared(main, tables, ignore_columns)
    at_call = yield from _capture(found)

    def put_back(snapshots: list[Snapshot]) -> Generator[Step, Any, None]:
        for index, (database, snapshot) in enumerate(zip(found, snapshots, strict=True)):
            yield OnDatabase(index, functools.partial(database.restore, snapshot=snapshot))

    def between() -> Generator[Step, Any, None]:
        for index, database in enumerate(found):
            yield OnDatabase(index, database.reset_counters)

    providers = live_providers()
    yield from put_back(at_call)
    before = _counts(providers)
    try:
        yield Deliver()
    except Exception as exc:
        yield from put_back(at_call)
        raise NotIdempotent(
            f"message {message.id} (type {message.type!r}) fails on a clean run, so its "
            f"redeliveries cannot be judged: {type(exc).__name__}: {exc}"
        ) from exc
    after_clean = yield from _capture(found)
    clean_calls = _called_since(providers, before)
    findings: list[str] = []
    for scenario in scenarios([h.name for h in inbox._registry.for_type(message.type)]):
        yield from put_back(at_call)
        before = _counts(providers)
        try:
            remarks = yield from scenario.steps(between)
        except Exception as exc:
            findings.append(f"{scenario.title}:\n  it raised {type(exc).__name__}: {exc}")
            continue
        now: Snapshot = yield OnDatabase(0, main.capture)
        differences = _differences(main, after_clean[0], now, compared)
        differences += _repeated_calls(clean_calls, _called_since(providers, before))
        if differences or remarks:
            lines = [f"  {remark}" for remark in remarks] + differences
            findings.append(f"{scenario.title}:\n" + "\n".join(lines))
    yield from put_back(after_clean)
    if findings:
        raise NotIdempotent(_report(message, compared, findings))


def _counts(providers: list[FakeProvider]) -> list[Counter[Hashable]]:
    return [provider.counts() for provider in providers]


def _called_since(
    providers: list[FakeProvider], before: list[Counter[Hashable]]
) -> list[tuple[FakeProvider, Counter[Hashable]]]:
    return [
        (provider, provider.counts() - earlier)
        for provider, earlier in zip(providers, before, strict=True)
    ]


def _repeated_calls(
    clean: list[tuple[FakeProvider, Counter[Hashable]]],
    now: list[tuple[FakeProvider, Counter[Hashable]]],
) -> list[str]:
    """A line per FakeProvider this run called more often than the clean run did."""
    lines = []
    for (provider, expected), (_, got) in zip(clean, now, strict=True):
        if got.total() > expected.total() or got - expected:
            lines.append(
                f"  FakeProvider {provider.name!r}: called {got.total()} time(s), "
                f"{expected.total()} in the clean run: a call made outside inbox.effect is "
                "made again by every redelivery (make it through inbox.effect(step, call))"
            )
    return lines


def _capture(databases: list[Database]) -> Generator[Step, Any, list[Snapshot]]:
    snapshots: list[Snapshot] = []
    for index, database in enumerate(databases):
        snapshots.append((yield OnDatabase(index, database.capture)))
    return snapshots


def _compared(
    database: Database, tables: Sequence[str | Table], ignore_columns: Collection[str]
) -> dict[str, list[str]]:
    """Table name → the columns left out of its comparison; ValueError for a bad name."""
    if isinstance(tables, str) or not tables:
        raise ConfigurationError("tables= takes a non-empty list of table names or Table objects")
    names = [t.key if isinstance(t, Table) else t for t in tables]
    compared: dict[str, list[str]] = {
        database.table(name).key: _set_per_publish(database.table(name)) for name in names
    }
    for column in ignore_columns:
        table, dot, name = column.rpartition(".")
        if not dot or table not in compared:
            raise ConfigurationError(
                f"ignore_columns: {column!r} is not 'table.column' for one of the compared "
                f"tables ({', '.join(compared)})"
            )
        if name not in database.table(table).columns:
            raise ConfigurationError(f"ignore_columns: table {table!r} has no column {name!r}")
        if name not in compared[table]:
            compared[table].append(name)
    return compared


_OUTBOX_COLUMNS: Final = frozenset(c.name for c in outbox_message.columns)
_SET_PER_PUBLISH: Final = ("id", "created_at", "available_at")


_TRACE_HEADERS: Final = frozenset({"traceparent", "tracestate"})


def _untraced(columns: list[str], rows: Counter[Any]) -> Counter[Any]:
    """Outbox rows with the trace context left out of their headers: each publish stores
    the span current at the time (when tracing is on), another one in every run."""
    if "headers" not in columns:
        return rows
    at = columns.index("headers")
    untraced: Counter[Any] = Counter()
    for row, count in rows.items():
        try:
            headers = json.loads(row[at])
        except (TypeError, ValueError):
            untraced[row] += count
            continue
        if not isinstance(headers, dict):
            untraced[row] += count
            continue
        kept = {k: v for k, v in headers.items() if k not in _TRACE_HEADERS}
        untraced[(*row[:at], json.dumps(kept, sort_keys=True), *row[at + 1 :])] += count
    return untraced


def _set_per_publish(table: Table) -> list[str]:
    """An outbox table's columns that every publish sets anew (a fresh UUIDv7 id, the
    time): the same handler writes other values in each run, so they are not compared."""
    if {c.name for c in table.columns} == _OUTBOX_COLUMNS:
        return list(_SET_PER_PUBLISH)
    return []


def _differences(
    database: Database, reference: Snapshot, now: Snapshot, compared: dict[str, list[str]]
) -> list[str]:
    lines: list[str] = []
    for table, ignored in compared.items():
        columns, expected = database.rows(reference, table, ignored)
        _, got = database.rows(now, table, ignored)
        if _set_per_publish(database.table(table)):
            expected, got = _untraced(columns, expected), _untraced(columns, got)
        if expected == got:
            continue
        lines.append(
            f"  table {table}: {expected.total()} row(s) after the clean run, "
            f"{got.total()} after this one"
        )
        for sign, rows in (("-", expected - got), ("+", got - expected)):
            shown = sorted(rows.elements(), key=repr)
            for row in shown[:_ROWS_SHOWN]:
                lines.append(f"    {sign} {dict(zip(columns, row, strict=True))}")
            if len(shown) > _ROWS_SHOWN:
                lines.append(f"    {sign} ... and {len(shown) - _ROWS_SHOWN} more")
    return lines


def _report(message: Message, compared: dict[str, list[str]], findings: list[str]) -> str:
    ignored = [f"{t}.{c}" for t, columns in compared.items() for c in columns]
    return "\n".join(
        [
            f"message {message.id} (type {message.type!r}) is not handled idempotently: "
            f"{len(findings)} redelivery scenario(s) left the database different from one "
            "clean run ('-' only after the clean run, '+' only after the redelivery)",
            "",
            *findings,
            "",
            f"compared: {', '.join(compared)}; ignored columns: {', '.join(ignored) or 'none'}",
        ]
    )
