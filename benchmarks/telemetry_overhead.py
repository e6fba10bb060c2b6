"""What telemetry costs ``inbox.process`` per message: OpenTelemetry absent, the API
installed with no SDK configured, and an SDK configured (a metric reader and a tracer
provider exporting to nowhere), side by side in one run.

    .venv/bin/python benchmarks/telemetry_overhead.py [--databases postgresql sqlite]
        [--messages N] [--rounds R] [--json PATH]

The three modes cannot share a process (OpenTelemetry's providers are global, and "absent"
means the import fails), so each mode runs in a child process of its own, in a fresh schema,
warmed up once; the parent asks each child for ``--messages`` messages per round, the modes
alternating which goes first round by round. The table gives the median µs per message and
the (min..max) spread over the rounds; the JSON has every sample.

"sdk" is an SDK as an application would configure one: a ``MeterProvider`` with an
in-memory reader (it aggregates as any reader does; nothing is exported) and a
``TracerProvider`` with a ``BatchSpanProcessor`` whose exporter drops the spans.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

_ABSENT = "TELEMETRY_BENCH_ABSENT"
if os.environ.get(_ABSENT):
    # Before anything imports inbox (common does): every opentelemetry import fails.
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]

from common import DEFAULT_DATABASE, alternate, median_spread, write_report  # noqa: E402

MODES = ("absent", "api", "sdk")
LABELS = {"absent": "no opentelemetry", "api": "API, no SDK", "sdk": "SDK configured"}


def child(mode: str, url: str) -> None:
    """Serve measurements for ``mode`` on ``url``: read a message count per line from
    stdin, answer the µs per message on stdout; stop at end of input."""
    if mode == "sdk":
        install_sdk()
    from common import fresh_schema
    from sqlalchemy import Column, Integer, MetaData, Table, insert
    from sqlalchemy.orm import Session, sessionmaker

    import inbox.telemetry
    from inbox import Inbox, Message, Outcome
    from inbox.core._settlement import Settlement
    from inbox.telemetry._core import claim_timer

    def claim(message: Message) -> bool:
        return message is not None

    assert inbox.telemetry.ENABLED is (mode != "absent")
    business = MetaData()
    rows = Table("bench_row", business, Column("id", Integer, primary_key=True))
    statement = insert(rows)

    def handler(message: Message, session: Session) -> None:
        session.execute(statement, {"id": message.body["n"]})

    with fresh_schema(url, business) as engine:
        box = Inbox(sessionmaker(engine))
        box.handler("bench", name="bench.insert")(handler)
        counter = iter(range(10**9))

        def run(messages: int) -> float:
            batch = [Message.new("bench", {"n": next(counter)}) for _ in range(messages)]
            started = time.perf_counter()
            for message in batch:
                if box.process(message).outcome is not Outcome.PROCESSED:
                    raise AssertionError(f"{message.id} was not processed")
            return (time.perf_counter() - started) / messages * 1e6

        def hooks(messages: int) -> float:
            # What process() adds per message for telemetry, without the database: the
            # Settlement a message's outcomes go through, and the claim's timer.
            batch = [Message.new("bench", {"n": 0}) for _ in range(messages)]
            started = time.perf_counter()
            for message in batch:
                settlement = Settlement(message)
                timer = claim_timer()
                if timer is None:
                    claim(message)
                else:
                    started_claim = timer.started()
                    claim(message)
                    timer.record("bench.insert", started_claim)
                settlement.done("bench.insert", Outcome.PROCESSED)
                settlement.result()
            return (time.perf_counter() - started) / messages * 1e6

        run(500)  # warm the pool, the statement caches, the server's plans
        hooks(500)
        print("ready", flush=True)
        for line in sys.stdin:
            count = int(line)
            print(f"{run(count):.3f} {hooks(count * 10):.3f}", flush=True)


def install_sdk() -> None:
    """A MeterProvider with an in-memory reader and a TracerProvider whose spans are
    batched to an exporter that drops them."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(tracer_provider)


class Child:
    """One mode's child process, answering one measurement per request."""

    def __init__(self, mode: str, url: str) -> None:
        self.mode = mode
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--child", mode, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, _ABSENT: "1" if mode == "absent" else ""},
        )
        self._expect("ready")

    def measure(self, messages: int) -> tuple[float, float]:
        """µs per message through ``inbox.process``, and in the telemetry hooks alone."""
        stdin: IO[str] | None = self.process.stdin
        assert stdin is not None
        stdin.write(f"{messages}\n")
        stdin.flush()
        process, hooks = self._expect().split()
        return float(process), float(hooks)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(120)

    def _expect(self, wanted: str | None = None) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if not line or (wanted is not None and line != wanted):
            raise RuntimeError(f"{self.mode} child said {line!r} (exit {self.process.poll()})")
        return line


def measure(url: str, messages: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """µs per message of each mode (``process``, and ``hooks`` alone), one sample per
    round."""
    # SQLite: a file per mode (fresh_schema uses the URL as it is); servers: a schema each.
    children = [Child(mode, url.replace("{mode}", mode)) for mode in MODES]
    samples: dict[str, dict[str, list[float]]] = {
        kind: {mode: [] for mode in MODES} for kind in ("process", "hooks")
    }
    try:
        for round_number in range(rounds):
            for one in alternate(round_number, children):
                process, hooks = one.measure(messages)
                samples["process"][one.mode].append(process)
                samples["hooks"][one.mode].append(hooks)
    finally:
        for one in children:
            one.close()
    return samples


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--databases", nargs="+", default=["postgresql", "sqlite"], choices=["postgresql", "sqlite"]
    )
    parser.add_argument("--database-url", default=DEFAULT_DATABASE, help="the PostgreSQL URL")
    parser.add_argument("--messages", type=int, default=3000, help="messages per mode per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="where to write the JSON")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "URL"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        child(*options.child)
        return 0
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        urls = {"postgresql": options.database_url, "sqlite": f"sqlite:///{scratch}/{{mode}}.db"}
        for database in options.databases:
            print(f"{database}: {options.rounds} rounds of {options.messages} messages per mode")
            results[database] = measure(urls[database], options.messages, options.rounds)
    print_table(results)
    write_report(
        "telemetry_overhead",
        options.json,
        {
            "parameters": {"messages": options.messages, "rounds": options.rounds},
            "us_per_message": results,
        },
    )
    return 0


def print_table(results: dict[str, dict[str, dict[str, list[float]]]]) -> None:
    """Median µs per message (min..max) per mode, and what the SDK adds: through
    ``inbox.process`` per database, and in the hooks alone."""
    rows = [("measured", *(LABELS[m] for m in MODES), "SDK - absent", "API - absent")]
    measured = [(f"inbox.process, {db}", kinds["process"]) for db, kinds in results.items()]
    measured += [(f"hooks alone ({db} run)", kinds["hooks"]) for db, kinds in results.items()]
    for database, samples in measured:
        medians = {}
        cells = []
        for mode in MODES:
            median, (low, high) = median_spread(samples[mode])
            medians[mode] = median
            cells.append(f"{median:.2f} µs ({low:.2f}..{high:.2f})")
        sdk_extra = medians["sdk"] - medians["absent"]
        api_extra = medians["api"] - medians["absent"]
        rows.append(
            (
                database,
                *cells,
                f"{sdk_extra:+.2f} µs ({sdk_extra / medians['absent']:+.1%})",
                f"{api_extra:+.2f} µs ({api_extra / medians['absent']:+.1%})",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print()
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if index == 0:
            print("  ".join("-" * width for width in widths))


if __name__ == "__main__":
    sys.exit(main())
