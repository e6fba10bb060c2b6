"""Errors of the broker edge.

They live here, next to the code that raises them, and import nothing from kombu, so that
``inbox.errors`` can still hand them out lazily without ``import inbox`` loading kombu.
"""

from __future__ import annotations

from inbox.errors import InboxError

__all__ = ["PublishError"]


class PublishError(InboxError):
    """The broker did not take a published message: unroutable (no queue bound for it) or
    nacked. The message was not delivered; publishing it again is safe."""
