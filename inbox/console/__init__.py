"""``inbox console``: the operator console in the browser. Dead letters (replay, purge),
uncertain effects (mark done, release), refused outbox rows (retry, drop) and claims (look
up, release), on the same operations as the ``inbox`` command. The manual is
docs/console.md; the web stack is the ``console`` extra."""

from typing import TYPE_CHECKING

from inbox.console._auth import Credentials, load_credentials
from inbox.console._settings import ConsoleSettings

if TYPE_CHECKING:
    from inbox.console._app import create_app

__all__ = ["ConsoleSettings", "Credentials", "create_app", "load_credentials"]


def __getattr__(name: str) -> object:
    # create_app imports Starlette: only when asked, so `inbox --help` needs no extra.
    if name == "create_app":
        from inbox.console._app import create_app

        return create_app
    raise AttributeError(name)
