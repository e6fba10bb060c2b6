"""What every broker edge decides the same way, with no I/O: a delivery read into a
``Message`` (or the reason it cannot be), the decision after processing (ack, retry, dead
letter, halt), the actions that carry it out (ack, a confirmed copy, a hold, give back), the
``x-inbox-*`` headers of the copies, the queue layout, body codecs and the counters.

Its public modules: :mod:`~inbox.delivery.transport` (what a broker edge implements, and
the shells that run a delivery on it), :mod:`~inbox.delivery.headers`,
:mod:`~inbox.delivery.codec` and :mod:`~inbox.delivery.topology`. The kombu worker
(``inbox.broker``) and the FastStream edge (``inbox.faststream``) are transports; their
public names are re-exported by ``inbox.broker``.
"""

__all__ = ["codec", "headers", "topology", "transport"]
