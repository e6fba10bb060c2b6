"""The ``inbox`` operator command: ``status``, ``show``, ``release``, ``dlq list|replay``,
``cleanup``. The manual is docs/operations.md."""

from inbox.admin.cli import admin_main

__all__ = ["admin_main"]
