"""Celery tasks with exactly-once database effects (``pip install sqlalchemy-inbox[celery]``).

::

    tasks = InboxTasks(app, inbox, sessionmaker(engine))

    @tasks.task(key=lambda order_id: f"charge-{order_id}", max_retries=5)
    def charge(session: Session, order_id: int) -> dict[str, str]:
        session.add(Payment(order_id=order_id))
        return {"status": "charged"}

    charge.delay(42)

The task's body runs in the inbox's handler transaction: its writes, its claim and its
return value commit together, once per task id (or ``key=``), however often Celery delivers
it. See docs/celery.md. Importing :mod:`inbox` imports nothing of Celery; this package does.
"""

from inbox.celery._beat import beat_slot
from inbox.celery._results import (
    DEFAULT_MAX_RESULT_BYTES,
    ResultTooLarge,
    result_metadata,
    task_result_table,
)
from inbox.celery._task import InboxTask, current_session, task_message_id
from inbox.celery._tasks import InboxTasks, TaskKey

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "InboxTask",
    "InboxTasks",
    "ResultTooLarge",
    "TaskKey",
    "beat_slot",
    "current_session",
    "result_metadata",
    "task_message_id",
    "task_result_table",
]
