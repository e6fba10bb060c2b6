"""Retention: delete claims older than a window, in short batches that run beside workers.

:func:`cleanup` is also exported by :mod:`inbox`; the partition functions of a partitioned
PostgreSQL table are published by :mod:`inbox.partitioning`; ``inbox-cleanup`` is
:func:`inbox.retention.cli.cleanup_main`. The modules with a leading underscore are
internal. See docs/operations.md.
"""

from typing import TYPE_CHECKING

from inbox._deprecated import deprecated_names
from inbox.retention._purge import CleanupReport, cleanup

__all__ = ["CleanupReport", "cleanup"]

# Hidden from type checkers: a module __getattr__ would make mypy accept any attribute of this
# module (a typo included); a deprecated name is then a type error, which is what it should be.
if not TYPE_CHECKING:
    __getattr__ = deprecated_names(
        __name__,
        {
            "MAX_CLEANUP_BATCH_SIZE": (
                "inbox.retention._purge",
                "cleanup() refuses a larger batch_size",
            ),
            "cutoff_for": (
                "inbox.retention._purge",
                "CleanupReport.cutoff is the cutoff cleanup() used",
            ),
        },
    )
