"""The chaos harness's effect stage (``--effects MODE``): every operation's handler also makes
an effect outside the database through ``inbox.effect``, a call to a fake provider that is a
file every worker process appends ``<op> <key>`` to (the kernel keeps a killed process's
line). Workers are also SIGKILLed inside the call (``--kill-in-call``).

At the end, per operation, the provider's calls are checked against the mode:

* both modes: no operation was ever called with two different keys, and every committed
  operation was called;
* at-least-once: a repeated call carries the same key (counted, allowed);
* at-most-once: no operation was called twice, and every ``uncertain-effect`` dead letter is
  accounted for: its operation was not committed and was called at most once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PROVIDER_FILE = "provider-calls"
MODES = ("at-least-once", "at-most-once")


def provider_calls(path: Path) -> dict[int, Counter[str]]:
    """op -> calls per key, from the provider's file."""
    calls: dict[int, Counter[str]] = {}
    if not path.exists():
        return calls
    for line in path.read_text().splitlines():
        op, key = line.split()
        calls.setdefault(int(op), Counter())[key] += 1
    return calls


def effect_report(
    mode: str,
    calls: dict[int, Counter[str]],
    committed: Iterable[int],
    dead: list[tuple[int, str]],
) -> dict[str, Any]:
    """The stage's figures and violations (lists of operations; empty when sound)."""
    committed_ops = set(committed)
    uncertain = sorted({op for op, reason in dead if reason == "uncertain-effect"})
    two_keys = sorted(op for op, keys in calls.items() if len(keys) > 1)
    called_twice = sorted(op for op, keys in calls.items() if keys.total() > 1)
    report: dict[str, Any] = {
        "mode": mode,
        "provider_calls": sum(keys.total() for keys in calls.values()),
        "operations_called": len(calls),
        "operations_called_again_same_key": len([op for op in called_twice if op not in two_keys]),
        "uncertain_effect_dead_letters": len(uncertain),
        # A duplicate that found the effect started while its first copy, whose database
        # session was terminated, was still calling: that copy committed later (docs/effects.md).
        "uncertain_then_committed": sorted(set(uncertain) & committed_ops),
        "violations": {
            "called_with_two_keys": two_keys,
            "committed_without_a_call": sorted(committed_ops - set(calls)),
            "called_twice_at_most_once": called_twice if mode == "at-most-once" else [],
            "uncertain_called_twice": sorted(
                op for op in uncertain if op in calls and calls[op].total() > 1
            ),
        },
    }
    report["sound"] = not any(report["violations"].values())
    return report


def report_lines(report: dict[str, Any]) -> list[str]:
    """The stage's lines in the harness's one-screen report."""
    violations = {k: len(v) for k, v in report["violations"].items() if v}
    return [
        f"  effects ({report['mode']})          calls {report['provider_calls']}, ops "
        f"{report['operations_called']}, called again with the same key "
        f"{report['operations_called_again_same_key']}, uncertain-effect dead letters "
        f"{report['uncertain_effect_dead_letters']}",
        f"  effect violations             {violations or 'none'}",
    ]
