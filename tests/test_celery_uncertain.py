"""An at-most-once effect whose pool child died inside the call: the redelivered Celery task
must not call again, and its dead letter says ``uncertain-effect`` (the reason every other
edge gives, and the one `inbox dlq --reason` and the docs name), not ``handler-failed``."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.databases import Database
from support.rabbit import AMQP_URL, rabbit_area
from test_celery_worker import sender, until, worker


def test_a_task_whose_effect_is_uncertain_is_dead_lettered_as_uncertain_effect(
    pg_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with rabbit_area() as area, sender(AMQP_URL, area.queue("celery"), pg_db, monkeypatch) as app:
        queue = area.queue("celery")
        (tmp_path / "callkill-p1").touch()
        paid = app.pay.delay("p1")
        app.pay.delay("p2")
        with worker(AMQP_URL, queue, pg_db, tmp_path):
            until(lambda: area.depth(f"{queue}.dlq") == 1, "the dead letter")
            until(lambda: ("p2", "ct.pay") in pg_db.effect_counts(), "the sound task")
        assert not (tmp_path / "callkill-p1").exists(), "the child died in the call"
        assert len((tmp_path / "paid-p1").read_text().split()) == 1, "called once, never again"
        assert pg_db.effect_counts() == {("p2", "ct.pay"): 1}
        [letter] = area.take_all(f"{queue}.dlq")
        assert letter.headers["id"] == paid.id
        assert letter.headers["x-inbox-reason"] == "uncertain-effect"
        assert "UncertainEffect" in letter.headers["x-inbox-error"]
