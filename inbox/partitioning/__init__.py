"""Optional PostgreSQL partitioning of the inbox table by message id, so that retention drops
whole partitions instead of deleting rows (docs/operations.md tells the whole story).

Partitioned by ``RANGE (message_id)``, not by ``processed_at``: every unique constraint of a
partitioned table must contain the partition key, so a key always maps to one partition and
the primary key stays the duplicate guard for the whole table. UUIDv7 ids start with their
millisecond timestamp, so a range of ids is a range of time. The layout of a table ``T``:
``T_before`` (DEFAULT: older ids and the ranges of dropped days), ``T_pYYYYMMDD`` (one per
day), ``T_future`` (up to the first id of 2074) and ``T_keys`` (above it: most
business keys). Maintenance is :func:`ensure_partitions` and :func:`inbox.cleanup`;
``inbox-cleanup`` runs both.

The names are published here; the code is in the modules of this package.
"""

from typing import TYPE_CHECKING

from inbox._deprecated import deprecated_names
from inbox.partitioning._autogenerate import skip_partitions
from inbox.partitioning._catalog import is_partitioned, list_partitions
from inbox.partitioning._create import create_partitioned_table, ensure_partitions
from inbox.partitioning._drop import DroppedPartitions, drop_detached_leftovers, drop_partitions
from inbox.partitioning._ids import id_floor
from inbox.partitioning._layout import Partition, PartitionLayoutError, partition_table

__all__ = [
    "DroppedPartitions",
    "Partition",
    "PartitionLayoutError",
    "create_partitioned_table",
    "drop_detached_leftovers",
    "drop_partitions",
    "ensure_partitions",
    "id_floor",
    "is_partitioned",
    "list_partitions",
    "partition_table",
    "skip_partitions",
]

_DEFAULTS = "the defaults are the functions' own (see their signatures)"
# Hidden from type checkers: a module __getattr__ would make mypy accept any attribute of this
# module (a typo included); a deprecated name is then a type error, which is what it should be.
if not TYPE_CHECKING:
    __getattr__ = deprecated_names(
        __name__,
        {
            "DEFAULT_DAYS_AHEAD": ("inbox.partitioning._layout", _DEFAULTS),
            "DEFAULT_HOLD_SECONDS": ("inbox.partitioning._layout", _DEFAULTS),
            "DEFAULT_LOCK_TIMEOUT": ("inbox.partitioning._layout", _DEFAULTS),
            "MAX_TABLE_NAME_LENGTH": (
                "inbox.partitioning._layout",
                "the layout's checks refuse longer names",
            ),
            "KEYS_BOUND": (
                "inbox.partitioning._ids",
                "list_partitions() gives each partition's bounds",
            ),
        },
    )
