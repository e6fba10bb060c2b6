"""MySQL and MariaDB: their knowledge (``_family``) and their backend (``_backend``: a
deadlock remembered as it happens, PyMySQL and asyncmy alike; ``_pymysql``: on PyMySQL, the
claim's transaction watched up to the check, so that no claim-row read precedes the COMMIT)."""

from inbox._backends.mysql._family import MySQLFamily

__all__ = ["FAMILY"]

FAMILY = MySQLFamily()
"""The MySQL/MariaDB family, as registered in :mod:`inbox._backends._registry`."""
