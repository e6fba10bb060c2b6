"""Effects outside the database in tests: a fake provider that counts calls per key (in
memory, or in a file that subprocesses append to), the effect store each backend needs, and
reading the effect records back."""

from __future__ import annotations

import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, select

from inbox.schema import inbox_effect
from support.databases import Database


@dataclass
class Provider:
    """A fake SMS/payment provider: every call is counted under its idempotency key; it
    fails while ``failures`` > 0 (after counting the call: the request reached it)."""

    calls: list[uuid.UUID] = field(default_factory=list)
    failures: int = 0

    def send(self, key: uuid.UUID, text: str = "hello") -> dict[str, Any]:
        self.calls.append(key)
        if self.failures > 0:
            self.failures -= 1
            raise TimeoutError("provider timed out (after receiving the request)")
        return {"id": f"sms-{len(self.calls)}", "key": str(key), "text": text}

    def per_key(self) -> Counter[uuid.UUID]:
        return Counter(self.calls)


class FileProvider:
    """A provider whose calls are lines appended to a file: processes that are killed
    afterwards leave their calls counted (the kernel has the write)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def send(self, key: uuid.UUID) -> dict[str, str]:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(descriptor, f"{key}\n".encode())
        finally:
            os.close(descriptor)
        return {"id": f"sms-{key.hex[:8]}", "key": str(key)}

    def per_key(self) -> Counter[str]:
        if not self.path.exists():
            return Counter()
        return Counter(self.path.read_text().split())


def effect_store(db: Database, tmp_path: Path) -> Engine | None:
    """The ``effect_store`` an inbox on ``db`` needs: a second SQLite file (with the effect
    table) for SQLite, None (the inbox's own database) for the servers."""
    if db.backend != "sqlite":
        return None
    store = create_engine(f"sqlite:///{tmp_path / 'effects.db'}")
    inbox_effect.create(store, checkfirst=True)
    return store


def records(engine: Engine) -> list[dict[str, Any]]:
    """Every effect record of ``engine``'s ``inbox_effect``, as dicts, ordered by step."""
    with engine.connect() as connection:
        rows = connection.execute(
            select(inbox_effect).order_by(inbox_effect.c.handler, inbox_effect.c.step)
        )
        return [dict(row._mapping) for row in rows]


def store_of(db: Database, store: Engine | None) -> Engine:
    """Where the effect records of an inbox on ``db`` with ``store`` live."""
    return db.engine if store is None else store
