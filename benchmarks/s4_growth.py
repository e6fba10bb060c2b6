"""S4: the claim rate as the inbox table grows, UUIDv7 keys against UUIDv4 keys.

    .venv/bin/python benchmarks/s4_growth.py [--rows 10000000] [--claims 5000] [--rounds 5]

Two fresh PostgreSQL schemas live side by side, one filled with UUIDv7 keys, one with
UUIDv4 keys, and a third, never filled, as a reference. At each checkpoint (fractions of
``--rows``: 0, 10 %, 20 %, 40 % ... 100 %) all three are measured, alternating the order round
by round: ``inbox.process`` of ``--claims`` new messages (ids of the schema's kind:
``inbox.uuid7()`` or ``uuid.uuid4()``; v7 for the reference) with a handler that does
nothing, so the rate is the claim's alone (BEGIN, claim, COMMIT). The reference holds only
the claims made so far, so "full table / reference in the same rounds" answers "how much
slower is a big table" without the machine's load drifting between checkpoints.

Between checkpoints each filled table is grown on the server with ``INSERT ... SELECT
generate_series`` in chunks, then ANALYZEd:

* v7: a 6-byte big-endian millisecond timestamp that rises by 1 ms per row from just after
  the highest key in the table (as one producer's ``inbox.uuid7()`` does when called faster
  than once a millisecond), then random bytes with the version (7) and variant bits;
  afterwards ``inbox.uuid7()`` is set to go on after the last of them, so the claims that
  follow arrive at the right edge of the key space like live traffic;
* v4: ``gen_random_uuid()``, 16 random bytes with the version (4) and variant bits.

``processed_at`` is ``clock_timestamp()`` for both. At the end it reports the table, primary
key and ``processed_at`` index sizes of both kinds and how long each fill took.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uuid6
from common import (
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    alternate,
    at_least,
    fresh_schema,
    median_spread,
    percentile,
    plot_lines,
    scenario_main,
    server_version,
)
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

import inbox
from inbox import Inbox, Message, Outcome

SCENARIO = "S4"
TITLE = "claim rate as the inbox table grows, UUIDv7 vs UUIDv4 keys"
QUICK: dict[str, Any] = {"rows": 200_000, "claims": 1000, "rounds": 2, "checkpoints": "0,0.5,1"}

HANDLER = "bench.claim_only"
FILLED = ("v7", "v4")
REFERENCE = "v7-ref"
SERIES = (*FILLED, REFERENCE)
"""Each series has a schema of its own; the reference is never filled, only claimed into."""
KEY_KIND = {"v7": "v7", "v4": "v4", REFERENCE: "v7"}
MB = 1024 * 1024

# One row per generated number; OFFSET 0 keeps the subquery from being flattened, so each
# volatile function is evaluated once per row and ``r`` is the same bytes in both places.
_ROWS = (
    "FROM (SELECT n, clock_timestamp() AS at, uuid_send(gen_random_uuid()) AS r "
    "FROM generate_series(0, :count - 1) AS n OFFSET 0) AS g"
)
FILL = {
    # bytes 0-5: :base + row number, a Unix time in ms, big-endian; byte 6: version 7 in the
    # high nibble; the rest random, with gen_random_uuid()'s variant bits in byte 8.
    "v7": text(
        "INSERT INTO inbox_message (message_id, handler, processed_at) "
        "SELECT set_byte(overlay(g.r PLACING substring(int8send(:base + g.n) FROM 3 FOR 6) "
        "FROM 1 FOR 6), 6, (get_byte(g.r, 6) & 15) | 112), :handler, g.at " + _ROWS
    ),
    "v4": text(
        "INSERT INTO inbox_message (message_id, handler, processed_at) "
        "SELECT g.r, :handler, g.at " + _ROWS
    ),
}
HIGHEST_KEY = text("SELECT message_id FROM inbox_message ORDER BY message_id DESC LIMIT 1")
SIZES = text(
    "SELECT pg_relation_size('inbox_message'::regclass), "
    "coalesce(sum(pg_relation_size(i.indexrelid)) FILTER (WHERE i.indisprimary), 0), "
    "coalesce(sum(pg_relation_size(i.indexrelid)) FILTER (WHERE NOT i.indisprimary), 0) "
    "FROM pg_index AS i WHERE i.indrelid = 'inbox_message'::regclass"
)
NEW_ID: dict[str, Callable[[], uuid.UUID]] = {"v7": inbox.uuid7, "v4": uuid.uuid4}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S4's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows at the last checkpoint")
    parser.add_argument(
        "--checkpoints",
        default="0,0.1,0.2,0.4,0.6,0.8,1",
        help="comma-separated fractions of --rows at which the claim rate is measured",
    )
    parser.add_argument("--claims", type=int, default=5000, help="messages per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="measurements per checkpoint")
    parser.add_argument(
        "--chunk", type=int, default=1_000_000, help="rows per INSERT ... SELECT while filling"
    )


def checkpoints(options: argparse.Namespace) -> list[int]:
    """The fill levels (rows) to measure at, ascending."""
    fractions = sorted({float(part) for part in options.checkpoints.split(",") if part.strip()})
    if not fractions or fractions[0] < 0 or fractions[-1] > 1:
        raise SystemExit(f"--checkpoints must be fractions from 0 to 1, got {options.checkpoints}")
    return sorted({round(f * options.rows) for f in fractions})


def claim_only(message: Message, session: Session) -> None:
    """Nothing: what is measured is the claim (BEGIN, insert-or-ignore, COMMIT)."""


def make_inbox(engine: Engine) -> Inbox:
    """An inbox on ``engine`` whose one handler does nothing."""
    box = Inbox(sessionmaker(engine))
    box.handler("bench", name=HANDLER)(claim_only)
    return box


def measure(box: Inbox, kind: str, claims: int) -> dict[str, float]:
    """Claim ``claims`` new messages of ``kind``; the rate and per-claim latency."""
    batch = [Message(NEW_ID[kind](), "bench", None) for _ in range(claims)]
    latencies = []
    clock = time.perf_counter
    started = clock()
    for message in batch:
        before = clock()
        if box.process(message).outcome is not Outcome.PROCESSED:
            raise AssertionError(f"{kind} {message.id}: not processed")
        latencies.append(clock() - before)
    elapsed = clock() - started
    return {
        "rate": claims / elapsed,
        "p50_us": percentile(latencies, 0.50) * 1e6,
        "p99_us": percentile(latencies, 0.99) * 1e6,
    }


def fill(engine: Engine, kind: str, count: int, chunk: int) -> float:
    """Add ``count`` rows of ``kind`` on the server, then ANALYZE; seconds it took.

    v7 rows get the milliseconds after the highest key in the table, one per row, the way
    one producer stamps them (``inbox.uuid7()`` moves on by 1 ms per id when called faster
    than once a millisecond); afterwards ``inbox.uuid7()`` is made to go on after the last
    of them, so that the next claims arrive at the right edge of the key space as live
    traffic would, not in front of rows stamped later than the wall clock.
    """
    started = time.perf_counter()
    with engine.connect() as connection:
        highest = connection.execute(HIGHEST_KEY).scalar()
    base = max(time.time_ns() // 1_000_000, int.from_bytes(bytes(highest or b"")[:6]) + 1)
    done = 0
    while done < count:
        step = min(chunk, count - done)
        params = {"count": step, "handler": HANDLER, "base": base + done}
        with engine.begin() as connection:
            connection.execute(FILL[kind], params)
        done += step
    if kind == "v7":
        continue_uuid7_after(base + count - 1)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("ANALYZE inbox_message"))
    return time.perf_counter() - started


def continue_uuid7_after(ms: int) -> None:
    """Make ``inbox.uuid7()`` stamp ids after the Unix time ``ms``; checked, not assumed."""
    state = vars(uuid6)  # uuid6.uuid7() stamps max(now, last + 1) ms; move "last" on
    last = state.get("_last_v7_timestamp")
    state["_last_v7_timestamp"] = ms if last is None else max(last, ms)
    if int.from_bytes(inbox.uuid7().bytes[:6]) <= ms:
        raise RuntimeError("uuid6 changed: cannot make inbox.uuid7() go on after the fill")


def sizes(engine: Engine) -> dict[str, int]:
    """Bytes of the table, its primary key and its processed_at index."""
    with engine.connect() as connection:
        table, pkey, processed_at = connection.execute(SIZES).one()
    return {"table": int(table), "pkey": int(pkey), "processed_at_index": int(processed_at)}


@dataclass
class Measured:
    """Everything one run measured, by series."""

    levels: list[int]
    samples: dict[str, dict[str, list[dict[str, float]]]] = field(
        default_factory=lambda: {k: {} for k in SERIES}
    )
    """series -> checkpoint -> one sample per round (rate, p50_us, p99_us, rows)."""
    fills: dict[str, list[dict[str, float]]] = field(
        default_factory=lambda: {k: [] for k in FILLED}
    )
    size_log: dict[str, dict[str, dict[str, int]]] = field(
        default_factory=lambda: {k: {} for k in SERIES}
    )
    """series -> checkpoint -> sizes after that checkpoint's claims."""
    final: dict[str, dict[str, int]] = field(default_factory=dict)
    version: str = ""


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Measure the claim rate at every checkpoint for both key kinds and the reference."""
    levels = checkpoints(options)
    measured = Measured(levels)
    samples, fills, size_log = measured.samples, measured.fills, measured.size_log
    rows = dict.fromkeys(SERIES, 0)
    with ExitStack() as stack:
        engines = {k: stack.enter_context(fresh_schema(options.database_url)) for k in SERIES}
        boxes = {k: make_inbox(engines[k]) for k in SERIES}
        measured.version = server_version(engines["v7"])
        for series in SERIES:  # the pool, the statement caches, the server's plans
            measure(boxes[series], KEY_KIND[series], min(500, options.claims))
            rows[series] += min(500, options.claims)
        filled = 0
        for level in levels:
            if level > filled:
                for kind in alternate(len(fills[FILLED[0]]), FILLED):
                    seconds = fill(engines[kind], kind, level - filled, options.chunk)
                    fills[kind].append({"from": filled, "to": level, "seconds": seconds})
                    rows[kind] += level - filled
                    print(f"  fill {kind}: {filled:>11,} -> {level:>11,} rows in {seconds:7.1f} s")
                filled = level
            for round_number in range(options.rounds):
                for series in alternate(round_number, SERIES):
                    sample = measure(boxes[series], KEY_KIND[series], options.claims)
                    sample["rows"] = rows[series]
                    samples[series].setdefault(str(level), []).append(sample)
                    rows[series] += options.claims
                    print(
                        f"  {level:>11,} rows, round {round_number + 1}: {series:<6} "
                        f"{sample['rate']:7.0f} claims/s  p50 {sample['p50_us']:6.0f} us  "
                        f"p99 {sample['p99_us']:7.0f} us"
                    )
            for series in SERIES:
                size_log[series][str(level)] = sizes(engines[series])
        measured.final = {k: sizes(engines[k]) for k in SERIES}
    return report(options, measured, out_dir)


def paired(
    samples: dict[str, dict[str, list[dict[str, float]]]], a: str, b: str, level: str
) -> tuple[float, tuple[float, float]]:
    """median(a) / median(b) at one checkpoint, and (min, max) of the per-round ratios: the
    two were measured in the same rounds, one right after the other."""
    rates_a = [s["rate"] for s in samples[a][level]]
    rates_b = [s["rate"] for s in samples[b][level]]
    per_round = [x / y for x, y in zip(rates_a, rates_b, strict=True)]
    return median_spread(rates_a)[0] / median_spread(rates_b)[0], (min(per_round), max(per_round))


def report(options: argparse.Namespace, measured: Measured, out_dir: Path) -> ScenarioReport:
    """Figures, the table printed to stdout, the plots."""
    levels, samples, fills = measured.levels, measured.samples, measured.fills
    size_log, final = measured.size_log, measured.final
    first, last = str(levels[0]), str(levels[-1])
    medians: dict[str, dict[str, float]] = {k: {} for k in SERIES}
    print(f"\nS4 claim rate (claims/s, median of {options.rounds}) as the table grows")
    header = "".join(f"  {series + ' claims/s':>16} {'min..max':>13}" for series in SERIES)
    print(f"{'rows':>12}{header}")
    for level in levels:
        cells = []
        for series in SERIES:
            median, (low, high) = median_spread([s["rate"] for s in samples[series][str(level)]])
            medians[series][str(level)] = median
            cells.append(f"{median:16.0f} {low:6.0f}..{high:<6.0f}")
        print(f"{level:>12,}  " + "  ".join(cells))
    print(f"\n{'series':<7} {'table MB':>9} {'pkey MB':>8} {'processed_at MB':>16} {'fill s':>8}")
    for series in SERIES:
        sz = final[series]
        fill_total = sum(f["seconds"] for f in fills.get(series, []))
        print(
            f"{series:<7} {sz['table'] / MB:9.1f} {sz['pkey'] / MB:8.1f} "
            f"{sz['processed_at_index'] / MB:16.1f} {fill_total:8.1f}"
        )
    figures: list[Figure] = []
    for kind in FILLED:
        at_zero = median_spread([s["rate"] for s in samples[kind][first]])
        at_max = median_spread([s["rate"] for s in samples[kind][last]])
        figures.append(
            Figure(f"{kind} claims/s at {levels[0]:,} rows", at_zero[0], "msg/s", spread=at_zero[1])
        )
        figures.append(
            Figure(f"{kind} claims/s at {levels[-1]:,} rows", at_max[0], "msg/s", spread=at_max[1])
        )
        ratio = at_max[0] / at_zero[0]
        # Worst and best case of the ratio over the rounds, as its spread.
        spread = (at_max[1][0] / at_zero[1][1], at_max[1][1] / at_zero[1][0])
        # The same question asked side by side: the full table against the near-empty
        # reference measured in the same rounds, immune to the machine's load drifting
        # between the first checkpoint and the last.
        side_by_side, side_spread = paired(samples, kind, REFERENCE, last)
        if kind == "v7":
            target, met = at_least(ratio, 0.8)
            figures.append(Figure("v7 at max rows / at 0", ratio, "ratio", target, met, spread))
            target, met = at_least(side_by_side, 0.8)
            name = "v7 at max rows / near-empty, same rounds"
            figures.append(Figure(name, side_by_side, "ratio", target, met, side_spread))
        else:
            figures.append(Figure("v4 at max rows / at 0", ratio, "ratio", spread=spread))
            name = "v4 at max rows / near-empty v7, same rounds"
            figures.append(Figure(name, side_by_side, "ratio", spread=side_spread))
    ratio, spread = paired(samples, "v4", "v7", last)
    figures.append(
        Figure("v4 / v7 claims/s at max rows, same rounds", ratio, "ratio", spread=spread)
    )
    for kind in FILLED:
        sz = final[kind]
        figures.append(Figure(f"{kind} primary key index", sz["pkey"] / MB, "MB"))
        figures.append(Figure(f"{kind} processed_at index", sz["processed_at_index"] / MB, "MB"))
        figures.append(Figure(f"{kind} table", sz["table"] / MB, "MB"))
        figures.append(Figure(f"{kind} fill time", sum(f["seconds"] for f in fills[kind]), "s"))
    plots = []
    labels = {"v7": "UUIDv7", "v4": "UUIDv4", REFERENCE: "UUIDv7, near-empty reference"}
    plot = plot_lines(
        out_dir / "s4_claim_rate_vs_rows.png",
        f"S4: claim rate vs inbox rows (median of {options.rounds} x {options.claims} claims)",
        "rows filled into inbox_message (the reference is never filled)",
        "claims/s",
        {
            labels[series]: (levels, [medians[series][str(level)] for level in levels])
            for series in SERIES
        },
    )
    if plot:
        plots.append(plot)
    plot = plot_lines(
        out_dir / "s4_index_size_vs_rows.png",
        "S4: primary key index size vs inbox rows",
        "rows filled into inbox_message",
        "MB",
        {
            f"{labels[kind]} pkey": (
                levels,
                [size_log[kind][str(lv)]["pkey"] / MB for lv in levels],
            )
            for kind in FILLED
        },
    )
    if plot:
        plots.append(plot)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "database": make_url(options.database_url).render_as_string(hide_password=True),
            "server_version": measured.version,
            "rows": options.rows,
            "checkpoints": levels,
            "claims": options.claims,
            "rounds": options.rounds,
            "chunk": options.chunk,
        },
        figures,
        {
            "samples": samples,
            "median_claims_per_s": medians,
            "fills": fills,
            "sizes_bytes_by_checkpoint": size_log,
            "final_sizes_bytes": final,
        },
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
