"""The Celery chaos run's ledger: what the database, the dead-letter queue and the processes'
logs say at the end of a run, and the problems it shows (a doubled or lost task or beat slot,
an effect called twice, a fault that did not fire)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

from celery_chaos_app import rows, ticks
from effect_stage import effect_report, provider_calls
from kombu import Connection
from sqlalchemy import Engine, func, select


def dead_letters(broker: str, queue: str) -> list[tuple[str, str]]:
    """Takes every dead letter of ``queue`` (``<queue>.dlq``): (ref or slot, reason)."""
    taken: list[tuple[str, str]] = []
    with Connection(broker) as connection:
        channel = connection.default_channel
        while (message := channel.basic_get(f"{queue}.dlq", no_ack=True)) is not None:
            if not hasattr(message, "decode"):  # py-amqp's own message
                message = channel.message_to_python(message)
            args, kwargs, _ = message.decode()
            what = kwargs.get("slot") if "slot" in kwargs else (args or ["?"])[0]
            taken.append((str(what), str((message.headers or {}).get("x-inbox-reason"))))
    return taken


def deliveries(markers: Path) -> list[tuple[str, str, float, str, int]]:
    """(task, ref or slot, time, hostname, pid) per delivery a pool child started."""
    path = markers / "deliveries"
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        task, what, when, host, pid = line.split()
        found.append((task, what, float(when), host, int(pid)))
    return found


def slow_redeliveries(markers: Path, slow_refs: list[int], sleep: float) -> dict[str, int]:
    """How the slow tasks were delivered: redeliveries that started while an earlier delivery
    of the same task was still in its sleep, and those on another worker."""
    overlapping = other_worker = 0
    by_ref: dict[str, list[tuple[float, str]]] = {}
    for task, what, when, host, _ in deliveries(markers):
        if task == "chaos.write" and int(what) in slow_refs:
            by_ref.setdefault(what, []).append((when, host))
    for runs in by_ref.values():
        runs.sort()
        for (first, host), (later, other) in itertools.pairwise(runs):
            if later < first + sleep:
                overlapping += 1
                other_worker += host != other
    return {
        "slow_delivery_log": {
            ref: [f"{when:.1f} {host}" for when, host in runs] for ref, runs in by_ref.items()
        },
        "slow_deliveries": sum(len(runs) for runs in by_ref.values()),
        "slow_redelivered_while_running": overlapping,
        "slow_redelivered_to_another_worker": other_worker,
    }


def ledger(
    engine: Engine,
    markers: Path,
    refs: list[int],
    dead: list[tuple[str, str]],
) -> dict[str, Any]:
    """Counts per task ref and per beat slot, and the effect stage's report."""
    with engine.connect() as connection:
        counted = connection.execute(select(rows.c.ref, func.count()).group_by(rows.c.ref))
        per_ref = {int(ref): int(n) for ref, n in counted}
        counted = connection.execute(select(ticks.c.slot, func.count()).group_by(ticks.c.slot))
        per_slot = {str(slot): int(n) for slot, n in counted}
    dead_refs = {what: reason for what, reason in dead if what.isdigit()}
    dead_slots = {what: reason for what, reason in dead if not what.isdigit()}
    sends_path = markers / "beat-sends"
    sends = Counter(sends_path.read_text().split()) if sends_path.exists() else Counter[str]()
    calls = provider_calls(markers / "provider-calls")
    committed = [ref for ref in refs if per_ref.get(ref, 0) > 0]
    effects = effect_report(
        "at-most-once",
        calls,
        committed,
        [(int(what), reason) for what, reason in dead_refs.items()],
    )
    return {
        "doubled": sorted(ref for ref, n in per_ref.items() if n > 1),
        "lost": sorted(ref for ref in refs if ref not in per_ref and str(ref) not in dead_refs),
        "committed": len(committed),
        "dead_letters": dict(Counter(dead_refs.values())),
        "dead_letters_not_uncertain": sorted(
            what for what, reason in dead_refs.items() if reason != "uncertain-effect"
        ),
        "beat_slots_sent": len(sends),
        "beat_sends": sends.total(),
        "beat_slots_sent_twice_or_more": sum(1 for n in sends.values() if n > 1),
        "beat_slots_doubled": sorted(slot for slot, n in per_slot.items() if n > 1),
        "beat_slots_lost": sorted(
            slot for slot in sends if slot not in per_slot and slot not in dead_slots
        ),
        "effects": effects,
    }


def problems(result: dict[str, Any]) -> list[str]:
    """What makes the run fail: a wrong ledger, or a fault that did not happen."""
    found = [
        f"{name}: {result[name][:20]}"
        for name in (
            "doubled",
            "lost",
            "dead_letters_not_uncertain",
            "beat_slots_doubled",
            "beat_slots_lost",
        )
        if result[name]
    ]
    if result["unfinished_at_end"]:
        found.append(
            f"{result['unfinished_at_end']} messages still queued or unacked at the end (not "
            "lost, not finished: the run stopped after --settle seconds without progress)"
        )
    if not result["effects"]["sound"]:
        found.append(f"effects: {result['effects']['violations']}")
    fired = {
        "pool children killed": result["children_killed"],
        "main processes killed": result["mains_killed"] + result["mains_killed_after_commit"],
        "pool children killed after commit": result["children_killed_after_commit"],
        "pool children killed in an effect's call": result["killed_in_call"],
        "broker connections cut": result["connections_cut"],
        "duplicated sends": result["duplicated_tasks"],
        "beat slots sent twice": result["beat_slots_sent_twice_or_more"],
    }
    if result["transport"] == "redis":
        fired["slow task redelivered while running"] = result["slow_redelivered_while_running"]
    if result["transport"] == "rabbitmq":
        fired["relay killed between publish and delete"] = result["relay_crashes"]
    found += [f"fault did not happen: {name}" for name, count in fired.items() if not count]
    return found
