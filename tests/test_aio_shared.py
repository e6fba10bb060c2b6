"""The blocking suite's backend-parametrized cases, run again through AsyncInbox: one
suite, both flavours.

Each case below is the very test function of tests/test_process.py or tests/test_batch.py,
collected here a second time with that module's ``Inbox`` replaced by
:class:`support.aio.AsyncInboxAsBlocking`: the same database reached through the async
driver (aiosqlite, psycopg async, asyncmy), the test's blocking handlers run on the
``AsyncSession``'s synchronous side, and every claim, check, guard, commit and batch
decision made by the async inbox. Cases that are about blocking-only set-ups (a
Connection-bound or scoped session, a pysqlite recipe, threads) stay in their own file.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import test_batch
import test_process
from support.aio import AsyncInboxAsBlocking

SHARED: dict[ModuleType, tuple[str, ...]] = {
    test_process: (
        "test_first_delivery_runs_handler_and_commits_claim_with_effect",
        "test_duplicate_delivery_skips_handler_and_commits_nothing",
        "test_failing_handler_leaves_no_claim_and_no_effect_then_retry_succeeds_once",
        "test_fan_out_failure_of_one_handler_reruns_only_that_handler",
        "test_business_key_dedups_two_different_message_ids",
        "test_business_key_as_uuid_or_16_bytes_is_stored_as_is",
        "test_header_idempotency_key_dedups_a_producer_retry_with_a_fresh_id",
        "test_handler_key_takes_precedence_over_the_header",
        "test_same_message_id_under_two_handler_names_runs_both",
        "test_bad_key_function_raises_invalid_key_and_runs_nothing",
        "test_unhandled_type_raises_by_default_and_is_ignored_when_configured",
        "test_catch_all_handler_takes_every_type_and_typed_handler_only_its_own",
        "test_handler_that_ends_the_transaction_gets_a_clear_error_and_nothing_commits",
        "test_handler_may_use_a_savepoint",
        "test_decisions_are_logged_on_the_inbox_logger",
        "test_effects_written_through_the_orm_commit_with_the_claim",
        "test_handler_names_differing_in_case_or_accents_are_distinct_claims",
        "test_a_violation_of_another_unique_constraint_is_an_error_not_a_duplicate",
        "test_a_swallowed_database_error_never_reports_uncommitted_work_as_processed",
        "test_a_handler_committing_behind_the_guards_is_refused_and_nothing_commits",
    ),
    test_batch: (
        "test_a_mixed_batch_gives_one_result_per_message_in_order_and_each_effect_once",
        "test_an_unhandled_type_in_a_batch_is_reported_at_its_place_and_the_rest_commits",
        "test_handlers_run_in_message_order_and_per_message_in_registration_order",
        "test_a_poison_message_at_any_position_fails_alone_and_every_other_commits_once",
        "test_several_poison_messages_fail_alone_and_every_other_commits_once",
        "test_a_failing_message_delivered_twice_in_one_batch_fails_for_both_copies",
        "test_a_batch_larger_than_one_claim_statement_page_claims_every_key_once",
        "test_a_handler_ending_the_transaction_in_a_batch_fails_for_its_message_only",
        "test_a_handler_committing_behind_the_guards_in_a_batch_loses_no_other_message",
    ),
}

for _module, _names in SHARED.items():
    for _name in _names:
        globals()[_name] = getattr(_module, _name)


@pytest.fixture(autouse=True)
def through_the_async_inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``Inbox(...)`` the shared cases make is an AsyncInbox in disguise."""
    for module in SHARED:
        monkeypatch.setattr(module, "Inbox", AsyncInboxAsBlocking)
    made = AsyncInboxAsBlocking.made
    made.clear()
    yield
    assert made, "the case never made an inbox: it did not run through the async inbox"
    for inbox in made:
        inbox.close()
    made.clear()
