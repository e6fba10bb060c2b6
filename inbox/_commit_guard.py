"""Keep a handler from ending the transaction the inbox owns — the one module that relies
on a SQLAlchemy internal.

While a handler runs, the session's ``commit``/``rollback``/``close``/``reset`` are shadowed
on the instance, and so is :meth:`Connection._commit_impl`: the step every commit of the
connection's transaction goes through (``session.get_transaction().commit()``,
``session.connection().commit()``). No public hook can refuse a commit *before* it reaches
the database without slowing every statement on the engine (a ``commit`` connection event
turns on event dispatch for all of them), so the internal is used here and nowhere else.
``tests/test_commit_guard.py`` is its canary: it fails loudly on a SQLAlchemy release that
changes it, and pyproject.toml bounds SQLAlchemy to the releases it was run on.

Commits that slip past anyway (raw SQL ``COMMIT``, the driver's ``commit()``) are caught
afterwards by the claim check in :mod:`inbox._transaction`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, NoReturn

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from inbox.errors import TransactionControlError

__all__ = ["CONNECTION_COMMIT_STEP", "Guards", "guard", "transaction_guards", "unguard"]

SESSION_CONTROL: Final = ("commit", "rollback", "close", "reset")
CONNECTION_COMMIT_STEP: Final = "_commit_impl"
"""The SQLAlchemy internal shadowed on the claim's connection while a handler runs."""

Guards = Mapping[str, Callable[..., NoReturn]]


def transaction_guards(handler: str) -> Guards:
    """Stand-ins, naming ``handler``, for the session methods that would end the inbox's
    transaction and for the connection's commit step."""

    def forbidden(method: str) -> Callable[..., NoReturn]:
        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise TransactionControlError(
                f"handler {handler!r} called session.{method}(): the inbox owns the "
                "transaction (it commits the claim and your writes together). Use "
                "session.flush() to send writes early, or session.begin_nested() for a "
                "savepoint; raise an exception to roll everything back."
            )

        return refuse

    def refuse_commit(*args: object, **kwargs: object) -> NoReturn:
        raise TransactionControlError(
            f"handler {handler!r} ended the inbox's transaction with a commit; it was refused "
            "and nothing was committed. The inbox commits the claim and your writes together: "
            "never commit in a handler."
        )

    guards = {method: forbidden(method) for method in SESSION_CONTROL}
    guards[CONNECTION_COMMIT_STEP] = refuse_commit
    return guards


def guard(session: Session, connection: Connection, guards: Guards) -> None:
    """Hide the transaction-ending methods behind ``guards`` until :func:`unguard`.

    Instance attributes shadow the class methods; the inbox itself always calls the class
    methods (``type(session).commit(session)``), after :func:`unguard`.
    """
    for name, stand_in in guards.items():
        target = connection if name == CONNECTION_COMMIT_STEP else session
        target.__dict__[name] = stand_in


def unguard(session: Session, connection: Connection) -> None:
    """Remove the guards, so a session that outlives the call (scoped_session) is intact."""
    for method in SESSION_CONTROL:
        session.__dict__.pop(method, None)
    connection.__dict__.pop(CONNECTION_COMMIT_STEP, None)
