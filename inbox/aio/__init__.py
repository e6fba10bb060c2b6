"""inbox for asyncio: :class:`AsyncInbox` on SQLAlchemy's ``AsyncSession``.

The same claim, decisions, outcomes, errors and guards as :class:`inbox.Inbox`, shared
rather than copied: the claim and the checks run on the session's synchronous side through
``AsyncSession.run_sync``, and only the handler and the waits are awaited.

Needs the ``aio`` extra (``pip install 'sqlalchemy-inbox[aio]'``): SQLAlchemy's asyncio layer
and the async drivers the inbox is tested on (psycopg, asyncpg, aiosqlite, asyncmy).
"""

from typing import TYPE_CHECKING

from inbox._deprecated import deprecated_names
from inbox.aio._inbox import AsyncInbox

__all__ = ["AsyncInbox"]

# Hidden from type checkers: a module __getattr__ would make mypy accept any attribute of this
# module (a typo included); a deprecated name is then a type error, which is what it should be.
if not TYPE_CHECKING:
    __getattr__ = deprecated_names(
        __name__,
        {
            "AsyncHandlerFunc": (
                "inbox.aio._inbox",
                "annotate async handlers with Message and AsyncSession",
            )
        },
    )
