"""MySQL and MariaDB: their knowledge (``_family``) and their backend (``_backend``: a
deadlock remembered as it happens), PyMySQL and asyncmy alike."""

from inbox.core._backends.mysql._family import MySQLFamily

__all__ = ["FAMILY"]

FAMILY = MySQLFamily()
"""The MySQL/MariaDB family, as registered in :mod:`inbox.core._backends._registry`."""
