"""Keep a handler from ending the transaction the inbox owns.

While a handler runs, the methods that would end the transaction are shadowed on the
instances it can reach: the session's ``commit``/``rollback``/``close``/``reset``, and
``commit``/``rollback``/``close`` of the session's transaction and of the claim's
connection (``session.get_transaction().commit()``, ``session.connection().commit()``).
Instance attributes shadow the class methods; the inbox itself always calls the class
methods, after :func:`unguard`. All are public method names: no SQLAlchemy internal.

What slips past anyway (raw SQL ``COMMIT``, the driver's ``commit()``, the connection's own
transaction object) is caught afterwards, before the COMMIT (:mod:`inbox.core._misuse`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, NoReturn

from sqlalchemy import Connection
from sqlalchemy.orm import Session, SessionTransaction

from inbox.errors import TransactionControlError

__all__ = ["Guards", "guard", "transaction_guards", "unguard"]

SESSION_METHODS: Final = ("commit", "rollback", "close", "reset")
TRANSACTION_METHODS: Final = ("commit", "rollback", "close")
"""Shadowed on the session's transaction and on the claim's connection alike."""


class Guards:
    """The stand-ins for one handler, made once at registration."""

    __slots__ = ("session", "transaction")

    def __init__(
        self,
        session: Mapping[str, Callable[..., NoReturn]],
        transaction: Mapping[str, Callable[..., NoReturn]],
    ) -> None:
        self.session = dict(session)
        self.transaction = dict(transaction)


def transaction_guards(handler: str) -> Guards:
    """Stand-ins, naming ``handler``, for the methods that would end the inbox's
    transaction."""

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

    def refuse_end(method: str) -> Callable[..., NoReturn]:
        def refuse(*args: object, **kwargs: object) -> NoReturn:
            raise TransactionControlError(
                f"handler {handler!r} tried to end the inbox's transaction with {method}(); "
                "it was refused. Raise an exception to roll everything back."
            )

        return refuse

    transaction: dict[str, Callable[..., NoReturn]] = {
        "commit": refuse_commit,
        "rollback": refuse_end("rollback"),
        "close": refuse_end("close"),
    }
    return Guards({method: forbidden(method) for method in SESSION_METHODS}, transaction)


def guard(
    session: Session, transaction: SessionTransaction, connection: Connection, guards: Guards
) -> None:
    """Shadow the transaction-ending methods with ``guards`` until :func:`unguard`."""
    session.__dict__.update(guards.session)
    transaction.__dict__.update(guards.transaction)
    connection.__dict__.update(guards.transaction)


def unguard(session: Session, transaction: SessionTransaction, connection: Connection) -> None:
    """Remove the guards, so a session that outlives the call (scoped_session) is intact."""
    objects = session.__dict__, transaction.__dict__, connection.__dict__
    try:
        s, t, c = objects
        del s["commit"], s["rollback"], s["close"], s["reset"]
        del t["commit"], t["rollback"], t["close"]
        del c["commit"], c["rollback"], c["close"]
    except KeyError:  # a handler deleted one of them itself: remove the rest
        for attributes, names in zip(objects, _ALL_NAMES, strict=True):
            for name in names:
                attributes.pop(name, None)


_ALL_NAMES: Final = (SESSION_METHODS, TRANSACTION_METHODS, TRANSACTION_METHODS)
