"""Hooks for the parts of the inbox outside the core: effects and the outbox relay."""

from __future__ import annotations

from inbox.telemetry import _names as n
from inbox.telemetry._api import INSTRUMENTS, metering

__all__ = ["record_effect", "record_outbox"]


def record_effect(outcome: str, handler: str, step: str) -> None:
    """Count one effect of ``handler`` at ``step`` that ended with ``outcome`` (for
    example ``"done"``, ``"skipped"``, ``"failed"``): ``inbox.effects``."""
    if INSTRUMENTS is None or not metering():
        return
    INSTRUMENTS.effects.add(1, {n.OUTCOME: outcome, n.HANDLER: handler, n.STEP: step})


def record_outbox(*, sent: int = 0, refused: int = 0, destination: str = "") -> None:
    """Count outbox rows the relay published (``sent``) and rows the broker refused
    (``refused``): ``inbox.outbox.sent``, ``inbox.outbox.refused``."""
    if INSTRUMENTS is None or not metering():
        return
    attributes = {n.DESTINATION: destination}
    if sent:
        INSTRUMENTS.outbox_sent.add(sent, attributes)
    if refused:
        INSTRUMENTS.outbox_refused.add(refused, attributes)
