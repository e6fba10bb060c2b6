"""Where the command-line adapters used to live: ``cleanup_main`` moved to
:mod:`inbox.retention.cli`, the shared helpers to :mod:`inbox._cli`. Both stay importable
from here."""

from inbox._cli import (
    DATABASE_URL_ENV,
    EXIT_DATABASE_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    UsageParser,
    mask_urls,
    whole_number,
)
from inbox.retention.cli import cleanup_main

__all__ = [
    "DATABASE_URL_ENV",
    "EXIT_DATABASE_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "UsageParser",
    "cleanup_main",
    "mask_urls",
    "whole_number",
]
