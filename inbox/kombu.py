"""The kombu broker edge under the name the architecture gives it; see :mod:`inbox.broker`."""

from inbox import broker as _broker
from inbox.broker import *  # noqa: F403 - the same public names, re-exported unchanged

__all__ = _broker.__all__
