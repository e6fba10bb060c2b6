"""A failed handler is one WARNING line with the error's type and first line; its traceback
only at DEBUG (the caller gets the error itself in HandlerFailed)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session, sessionmaker

from inbox import HandlerFailed, Inbox, Message
from inbox.schema import metadata


def failing_inbox() -> Inbox:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    inbox = Inbox(sessionmaker(engine))

    @inbox.handler("order.created", name="charge")
    def charge(message: Message, session: Session) -> None:
        raise ValueError("card declined\nsecond line of detail")

    return inbox


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_a_failure_is_one_line_and_its_traceback_only_at_debug(
    caplog: pytest.LogCaptureFixture, level: int
) -> None:
    inbox = failing_inbox()
    message = Message.new("order.created", {})
    with caplog.at_level(level, logger="inbox"), pytest.raises(HandlerFailed):
        inbox.process(message)
    failures = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(failures) == 1
    (record,) = failures
    line = record.getMessage()
    assert "\n" not in line
    assert f"handler charge failed on message {message.id}" in line
    assert "ValueError: card declined" in line
    assert "second line" not in line
    assert (record.exc_info is not None) == (level == logging.DEBUG)
    assert isinstance(record.inbox_error, ValueError)  # for log filters
