"""``inbox dlq`` on a real RabbitMQ (issue 32 items 9 and 10): a purge lists what it would
delete (id, type, reason, tries, replays, last error) before it asks, and nothing it read
for that list is moved by asking; dead letters without a message id are named by their
contents (``sha256:...``) and can be shown, replayed and purged one by one."""

from __future__ import annotations

import io
import json
from typing import Any

from console_support import dead_letter, declare_queues
from support.rabbit import Rabbit
from support.worker import wait_until

from inbox.admin import admin_main
from inbox.delivery import headers as h
from inbox.operations._dead_letters import dead_letter_queue, open_channel, publish_confirmed


def inbox_dlq(
    rabbit: Rabbit, *argv: str, answer: bool | None = None
) -> tuple[int, str, str, list[tuple[str, str, int]]]:
    """Run ``inbox dlq``; with ``answer``, a terminal answering it. Also returns each
    question with what had been printed and the dead-letter queue's depth when it was asked."""
    out, err = io.StringIO(), io.StringIO()
    asked: list[tuple[str, str, int]] = []
    queue = argv[argv.index("--queue") + 1]

    def confirm(question: str) -> bool:
        asked.append((question, out.getvalue(), rabbit.depth(dead_letter_queue(queue))))
        assert answer is not None
        return answer

    code = admin_main(
        ["dlq", *argv, "--broker", rabbit.url],
        stdout=out,
        stderr=err,
        confirm=confirm if answer is not None else None,
    )
    return code, out.getvalue(), err.getvalue(), asked


def test_a_purge_lists_what_it_would_delete_before_it_asks(rabbit: Rabbit) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    first = dead_letter(rabbit, queue, ref="a", error="ValueError: bad a\n  at line 2")
    dead_letter(rabbit, queue, ref="b", reason="unhandled-type")
    third = dead_letter(rabbit, queue, ref="c", error="KeyError: 'c'")
    dlq = dead_letter_queue(queue)

    code, out, err, asked = inbox_dlq(
        rabbit, "purge", "--queue", queue, "--reason", "handler-failed", answer=False
    )
    assert (code, err) == (2, "inbox: nothing purged\n")
    [(question, shown, depth)] = asked
    assert question == f"delete these dead letters of {dlq} for good?"
    lines = shown.splitlines()
    assert lines[0] == (
        f"would purge 2 of 3 dead letters from {dlq} (read 3, matched 2); left: 1 not "
        "matching the filters"
    )
    assert lines[1].startswith(f"  id={first} type=op reason=handler-failed tries=3 replays=0 ")
    assert lines[1].endswith("error=ValueError: bad a |   at line 2")
    assert lines[2].startswith(f"  id={third} ")
    assert lines[2].endswith("error=KeyError: 'c'")
    assert depth == 3  # what the preview read is back in place while it asks
    wait_until(lambda: rabbit.depth(dlq) == 3, "nothing purged")

    code, out, err, asked = inbox_dlq(
        rabbit, "purge", "--queue", queue, "--reason", "handler-failed", answer=True
    )
    assert code == 0, err
    assert len(asked) == 1
    assert out.splitlines()[-1] == (
        f"purged 2 of 3 dead letters from {dlq} (read 3, matched 2); left: 1 not matching the "
        "filters (bounded to the preview: the first 3 dead letters, at most 2 taken; any "
        "dead-lettered since are left in place)"
    )
    assert rabbit.depth(dlq) == 1

    code, out, err, asked = inbox_dlq(
        rabbit, "purge", "--queue", queue, "--reason", "handler-failed", answer=True
    )
    assert (code, asked) == (0, [])  # nothing matches: nothing to ask
    assert out.startswith(f"would purge 0 of 1 dead letters from {dlq}")


def no_id_letter(rabbit: Rabbit, queue: str, body: bytes) -> None:
    """A dead letter as a producer that sets no message id leaves it."""
    properties: dict[str, Any] = {
        "type": "op",
        "delivery_mode": 2,
        "application_headers": {h.REASON: "handler-failed", h.TRIES: 3, h.ERROR: "ValueError"},
    }
    with open_channel(rabbit.url) as channel:
        publish_confirmed(channel, body, properties, dead_letter_queue(queue))


def test_dead_letters_without_a_message_id_are_handled_one_by_one(rabbit: Rabbit) -> None:
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    for body in (b'{"n": 1}', b'{"n": 2}', b'{"n": 3}'):
        no_id_letter(rabbit, queue, body)
    dlq = dead_letter_queue(queue)

    code, out, err, _ = inbox_dlq(rabbit, "list", "--queue", queue, "--json")
    assert code == 0, err
    refs = [x["ref"] for x in json.loads(out)["dead_letters"]]
    assert all(r.startswith("sha256:") and len(r) == 7 + 16 for r in refs)
    assert len(set(refs)) == 3
    code, out, _, _ = inbox_dlq(rabbit, "list", "--queue", queue)
    assert out.splitlines()[1].startswith(f"ref={refs[0]} type=op reason=handler-failed")

    code, out, _, _ = inbox_dlq(rabbit, "show", "--queue", queue, refs[1])
    assert code == 0
    assert out.splitlines()[-1] == '{"n": 2}'

    code, out, err, _ = inbox_dlq(rabbit, "replay", "--queue", queue, "--id", refs[1])
    assert code == 0, err
    assert out.startswith(f"replayed 1 of 3 dead letters from {dlq} to {queue} (read 3, matched 1)")
    assert [m.body for m in rabbit.take_all(queue)] == [b'{"n": 2}']

    code, out, err, _ = inbox_dlq(rabbit, "purge", "--queue", queue, "--id", refs[2], "--yes")
    assert code == 0, err
    assert out.startswith(f"purged 1 of 2 dead letters from {dlq} (read 2, matched 1)")
    assert [m.body for m in rabbit.take_all(dlq)] == [b'{"n": 1}']


def test_a_confirmed_purge_deletes_only_what_its_preview_listed(rabbit: Rabbit) -> None:
    """A matching dead letter that arrives while the operator reads the question is left in
    place: the purge reads no further than the preview did, and says so."""
    queue = rabbit.queue()
    declare_queues(rabbit, queue)
    for ref in ("a", "b"):
        dead_letter(rabbit, queue, ref=ref)
    dlq = dead_letter_queue(queue)
    late: list[str] = []

    def confirm(question: str) -> bool:
        late.append(dead_letter(rabbit, queue, ref="late"))  # during the think time
        return True

    out, err = io.StringIO(), io.StringIO()
    code = admin_main(
        ["dlq", "purge", "--queue", queue, "--broker", rabbit.url],
        stdout=out,
        stderr=err,
        confirm=confirm,
    )
    assert code == 0, err.getvalue()
    lines = out.getvalue().splitlines()
    assert lines[0] == f"would purge 2 of 2 dead letters from {dlq} (read 2, matched 2)"
    assert lines[-1] == (
        f"purged 2 of 3 dead letters from {dlq} (read 2, matched 2); left: 1 not read (not "
        "read by the preview) (bounded to the preview: the first 2 dead letters, at most 2 "
        "taken; any dead-lettered since are left in place)"
    )
    assert [m.properties["message_id"] for m in rabbit.take_all(dlq)] == late
