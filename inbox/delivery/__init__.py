"""What every broker edge decides the same way, with no I/O: a delivery read into a
``Message`` (or the reason it cannot be), the decision after processing (ack, retry, dead
letter, halt), the ``x-inbox-*`` headers of the copies, the queue layout, body codecs and
the counters. The kombu worker (``inbox.broker``) and the FastStream edge
(``inbox.faststream``) only carry these out; their public names are re-exported by
``inbox.broker``.
"""

__all__: list[str] = []
