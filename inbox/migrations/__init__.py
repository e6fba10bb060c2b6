"""The shipped alembic revisions of the inbox table.

They travel inside the distribution so that an application with its own alembic history can
add them as a second version location: ``version_locations = ... inbox:migrations/versions``
(see the README). The revisions carry the branch label ``inbox``.
"""

from typing import Final

VERSION_LOCATION: Final = "inbox:migrations/versions"
"""The alembic ``version_locations`` entry that finds the shipped revisions."""

BRANCH_LABEL: Final = "inbox"
"""The branch label of the inbox revisions: ``alembic upgrade inbox@head``."""
