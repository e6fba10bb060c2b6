"""Retention: delete claims older than a window, in short batches that run beside workers.

:func:`cleanup` is also exported by :mod:`inbox`; the partition functions of a partitioned
PostgreSQL table are published by :mod:`inbox.partitioning`; ``inbox-cleanup`` is
:func:`inbox.retention.cli.cleanup_main`. The modules with a leading underscore are
internal. See docs/operations.md.
"""

from inbox.retention._purge import MAX_CLEANUP_BATCH_SIZE, CleanupReport, cleanup, cutoff_for

__all__ = ["MAX_CLEANUP_BATCH_SIZE", "CleanupReport", "cleanup", "cutoff_for"]
