"""MySQL and MariaDB: the claim and the claim-row read through SQLAlchemy; a deadlock
remembered as it happens; the claim's duplicate told apart from other errors 1062.

InnoDB rolls back the whole transaction (savepoints included) on a deadlock. A handler that
catches that error and goes on would otherwise commit its later writes in a new implicit
transaction, without the claim; nothing in the driver's state shows it afterwards, so the
error is remembered on the connection when it happens (a ``handle_error`` listener, which
runs only when a statement fails).
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import Connection
from sqlalchemy.engine import ExceptionContext

from inbox._backends._base import Backend, Claimed, TransactionState

__all__ = ["MySQLBackend", "duplicate_primary_key"]

# InnoDB rolls back the whole transaction (savepoints included) on a deadlock.
_TRANSACTION_ABORTING: Final = frozenset({1213})
_ABORTED_BY: Final = "inbox.transaction_aborted_by"
_DUPLICATE_ENTRY: Final = 1062


class MySQLBackend(Backend):
    """MySQL/MariaDB through PyMySQL or asyncmy."""

    def __init__(self) -> None:
        self.error_listener = _remember_transaction_abort

    def state(self, connection: Connection, claimed: Claimed) -> TransactionState:
        """ABORTED after a deadlock in this transaction, else unknown (read the row)."""
        if _ABORTED_BY in connection.info:
            return TransactionState.ABORTED
        return TransactionState.UNKNOWN

    def before_claims(self, connection: Connection) -> None:
        """Forget an abort remembered for an earlier transaction of this connection."""
        connection.info.pop(_ABORTED_BY, None)

    def abort_cause(self, connection: Connection) -> BaseException | None:
        """The error after which the server rolled back this transaction, if any."""
        cause: BaseException | None = connection.info.pop(_ABORTED_BY, None)
        return cause

    def release_locks(self, connection: Connection) -> None:
        """LOCK TABLES (which also commits) outlives ROLLBACK: release it before reading
        again, or the read fails and the connection goes back to the pool holding locks."""
        connection.exec_driver_sql("UNLOCK TABLES")


def _remember_transaction_abort(context: ExceptionContext) -> None:
    args: tuple[object, ...] = getattr(context.original_exception, "args", ())
    if context.connection is not None and args and args[0] in _TRANSACTION_ABORTING:
        context.connection.info[_ABORTED_BY] = (
            context.sqlalchemy_exception or context.original_exception
        )


def duplicate_primary_key(args: tuple[object, ...]) -> bool:
    """Whether a driver error's ``args`` are error 1062 on the PRIMARY key (the claim's)."""
    return (
        len(args) >= 2
        and args[0] == _DUPLICATE_ENTRY
        and isinstance(args[-1], str)
        # MariaDB says "for key 'PRIMARY'", MySQL 8 "for key '<table>.PRIMARY'".
        and "PRIMARY'" in args[-1]
    )
