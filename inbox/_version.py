"""The release of the package: the one place the version is written (pyproject.toml reads it
from here; RELEASING.md says when it changes)."""

from typing import Final

__all__ = ["DISTRIBUTION", "__version__"]

__version__ = "0.1.0"

DISTRIBUTION: Final = "sqlalchemy-inbox"
"""The name to install: ``pip install sqlalchemy-inbox``; the import name is ``inbox``."""
