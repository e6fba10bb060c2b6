"""S6: the worker's memory over a long run.

    .venv/bin/python benchmarks/s6_memory.py [--messages 500000] [--sample-every 1]
        [--worker-args "--prefetch 100"] [--py-spy PROFILE]

Starts ``inbox-worker s6_app:make_inbox`` (benchmarks/s6_app.py: a handler that inserts one
row into ``bench_order``) as a subprocess on a fresh queue and a fresh PostgreSQL schema,
then publishes ``--messages`` messages (UUIDv7 ids, JSON bodies, persistent) from a thread
with publisher confirms in batches, keeping the queue topped up ahead of the worker but
bounded (``--ahead`` ready messages at most), so the worker never waits for work and the
broker never holds the whole run.

Every ``--sample-every`` seconds it records the worker's resident memory (``VmRSS`` from
``/proc/<pid>/status``) and how many messages it processed (the highest committed
``bench_order.id``, an index lookup; the exact count is taken at the end). When all are
processed it stops the worker with SIGTERM and checks that it exited 0, that every message
was processed exactly once (as many rows, and as many distinct refs, as messages; as many
claims) and that nothing is left in the queue or its dead-letter queue.

Reported: RSS after warm-up (10 % of the messages), at the end, growth after warm-up
(target < 10 %), the highest RSS after warm-up, msg/s (from the first to the last claim's
``processed_at``), the worker's CPU time per message (``/proc/<pid>/stat``). Plot: RSS vs
messages processed. ``--py-spy FILE`` also records a py-spy profile of the worker
(``--py-spy-args``, default raw collapsed stacks) while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import amqp
from common import (
    DEFAULT_BROKER,
    DEFAULT_DATABASE,
    Figure,
    ScenarioReport,
    fresh_schema,
    plot_lines,
    scenario_main,
    server_version,
)
from kombu.connection import Connection
from s6_app import DATABASE_URL_ENV, MESSAGE_TYPE, business
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

import inbox
from inbox.delivery.topology import (
    DEFAULT_MAX_TRIES,
    DEFAULT_RETRY_DELAYS,
    QueueTopology,
    QueueType,
    RetryPolicy,
)

SCENARIO = "S6"
TITLE = "worker memory over a long run"
QUICK: dict[str, Any] = {"messages": 5000, "sample_every": 0.5}

HERE = Path(__file__).resolve().parent
MB = 1024 * 1024
WARM_UP_FRACTION = 0.10
GROWTH_TARGET_PERCENT = 10.0
PROGRESS = text("SELECT coalesce(max(id), 0) FROM bench_order")
FINAL_COUNTS = text(
    "SELECT (SELECT count(*) FROM bench_order), (SELECT count(DISTINCT ref) FROM bench_order), "
    "(SELECT count(*) FROM inbox_message), "
    "(SELECT extract(epoch FROM max(processed_at) - min(processed_at)) FROM inbox_message)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """S6's options."""
    parser.add_argument("--database-url", default=DEFAULT_DATABASE)
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--sample-every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument(
        "--worker-args",
        default="",
        help='extra inbox-worker flags, one string, e.g. "--prefetch 100"',
    )
    parser.add_argument(
        "--ahead", type=int, default=5000, help="most ready messages kept in the queue"
    )
    parser.add_argument("--batch", type=int, default=500, help="messages per confirmed batch")
    parser.add_argument(
        "--stats-interval", type=int, default=10, help="inbox-worker --stats-interval"
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=120.0,
        help="give up when nothing was processed for this many seconds",
    )
    parser.add_argument("--py-spy", type=Path, default=None, help="record a py-spy profile here")
    parser.add_argument(
        "--py-spy-args",
        default="--format raw --rate 100",
        help="extra py-spy record flags",
    )


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of process ``pid`` from /proc (VmRSS, VmHWM ...), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU time process ``pid`` has used, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


class Feeder(threading.Thread):
    """Publishes ``total`` messages in confirmed batches, keeping at most ``ahead`` ready."""

    def __init__(self, broker: str, queue: str, total: int, ahead: int, batch: int) -> None:
        super().__init__(name="s6-feeder", daemon=True)
        self.broker = Connection(broker)  # only to parse the URL
        self.queue = queue
        self.total = total
        self.ahead = ahead
        self.batch = batch
        self.published = 0
        self.confirmed = 0
        self.lowest_ready: int | None = None
        """The fewest ready messages seen once the queue was first topped up and before the
        last messages were published: above 0, the worker never waited for work."""
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        """Publish until done or told to stop; keep the error for the main thread."""
        try:
            self._feed()
        except BaseException as exc:
            self.error = exc

    def _feed(self) -> None:
        broker = self.broker
        connection = amqp.Connection(
            host=f"{broker.hostname}:{broker.port or 5672}",
            userid=broker.userid,
            password=broker.password,
            virtual_host=broker.virtual_host or "/",
        )
        connection.connect()
        try:
            channel = connection.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            while self.published < self.total and not self.stop.is_set():
                ready = channel.queue_declare(self.queue, passive=True).message_count
                if self.ahead <= self.published < self.total - self.ahead:
                    low = self.lowest_ready
                    self.lowest_ready = ready if low is None else min(low, ready)
                if ready > self.ahead - self.batch:
                    time.sleep(0.02)
                    continue
                count = min(self.batch, self.total - self.published)
                for ref in range(self.published, self.published + count):
                    channel.basic_publish(
                        amqp.Message(
                            json.dumps({"ref": ref, "amount": 7}).encode(),
                            content_type="application/json",
                            content_encoding="utf-8",
                            delivery_mode=2,
                            message_id=str(inbox.uuid7()),
                            type=MESSAGE_TYPE,
                        ),
                        exchange="",
                        routing_key=self.queue,
                    )
                self.published += count
                while self.confirmed < self.published:
                    connection.drain_events(timeout=30)
        finally:
            connection.close()

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self.confirmed = max(self.confirmed, delivery_tag)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        raise RuntimeError(f"the broker nacked publish {delivery_tag}")


def worker_topology(queue: str, worker_args: list[str]) -> QueueTopology:
    """The queues ``inbox-worker`` declares for ``queue`` with ``worker_args``."""
    parser = argparse.ArgumentParser(allow_abbrev=False, add_help=False)
    parser.add_argument("--retry-delays", default=None)
    parser.add_argument("--max-tries", type=int, default=DEFAULT_MAX_TRIES)
    parser.add_argument("--queue-type", default=QueueType.CLASSIC.value)
    known, _ = parser.parse_known_args(worker_args)
    delays = (
        tuple(float(d) for d in known.retry_delays.split(","))
        if known.retry_delays
        else DEFAULT_RETRY_DELAYS
    )
    return QueueTopology(queue, QueueType(known.queue_type), RetryPolicy(delays, known.max_tries))


def queue_depth(broker: str, name: str) -> int | None:
    """Ready messages in queue ``name``; None when it does not exist."""
    with Connection(broker) as connection:
        channel = connection.channel()
        try:
            return int(channel.queue_declare(name, passive=True).message_count)
        except amqp.exceptions.NotFound:
            return None


def delete_queues(broker: str, topology: QueueTopology) -> None:
    """Delete the worker's queue, its retry queues and its dead-letter queue."""
    with Connection(broker) as connection:
        channel = connection.channel()
        for queue in topology.queues():
            channel.queue_delete(queue.name)


def wait_for_line(log: Path, needle: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait until the worker logged ``needle``; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            raise RuntimeError(f"inbox-worker exited {process.returncode}:\n{log.read_text()}")
        time.sleep(0.1)
    raise RuntimeError(f"inbox-worker did not log {needle!r} within {timeout} s")


def stop_process(process: subprocess.Popen[bytes], sig: int, timeout: float) -> int | None:
    """Send ``sig`` to the process (if it still runs) and wait; its exit code or None."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def inbox_worker_command() -> str:
    """The ``inbox-worker`` console script beside this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "inbox-worker"
    found = str(beside) if beside.exists() else shutil.which("inbox-worker")
    if found is None:
        raise SystemExit("inbox-worker not found: pip install -e . in this interpreter's venv")
    return found


def run(options: argparse.Namespace, out_dir: Path) -> ScenarioReport:
    """Run the worker through ``--messages`` messages, sampling its memory."""
    out_dir.mkdir(parents=True, exist_ok=True)
    worker_args = shlex.split(options.worker_args)
    queue = f"bench-s6-{uuid.uuid4().hex[:8]}"
    topology = worker_topology(queue, worker_args)
    log = out_dir / "s6_worker.log"
    samples: list[dict[str, float]] = []
    result: dict[str, Any] = {}
    with fresh_schema(options.database_url, business) as engine:
        version = server_version(engine)
        environment = dict(os.environ)
        environment[DATABASE_URL_ENV] = engine.url.render_as_string(hide_password=False)
        command = [
            inbox_worker_command(),
            "s6_app:make_inbox",
            "--broker",
            options.broker,
            "--queue",
            queue,
            "--stats-interval",
            str(options.stats_interval),
            *worker_args,
        ]
        feeder = Feeder(options.broker, queue, options.messages, options.ahead, options.batch)
        profiler: subprocess.Popen[bytes] | None = None
        with log.open("wb") as log_file:
            worker = subprocess.Popen(
                command, cwd=HERE, env=environment, stdout=log_file, stderr=subprocess.STDOUT
            )
        try:
            wait_for_line(log, "consuming ", worker, timeout=60)
            if options.py_spy is not None:
                profiler = start_profiler(options, worker.pid)
            feeder.start()
            samples = sample_until_done(options, engine, worker, feeder)
            result["vm_hwm_bytes"] = rss_bytes(worker.pid, "VmHWM")
            if profiler is not None:
                result["py_spy_exit"] = stop_process(profiler, signal.SIGINT, 60)
                profiler = None
            result["exit_code"] = stop_process(worker, signal.SIGTERM, 60)
            result.update(final_checks(options, engine, topology))
        finally:
            feeder.stop.set()
            feeder.join(10)
            if profiler is not None:
                stop_process(profiler, signal.SIGINT, 30)
            if stop_process(worker, signal.SIGTERM, 30) is None:
                stop_process(worker, signal.SIGKILL, 10)
            delete_queues(options.broker, topology)
    result["log_tail"] = log.read_text(errors="replace").splitlines()[-5:]
    result["lowest_ready_while_feeding"] = feeder.lowest_ready
    return report(
        options, command=command, samples=samples, result=result, version=version, out_dir=out_dir
    )


def start_profiler(options: argparse.Namespace, pid: int) -> subprocess.Popen[bytes]:
    """``py-spy record`` on the worker until it is sent SIGINT."""
    py_spy = Path(sys.executable).parent / "py-spy"
    command = [
        str(py_spy) if py_spy.exists() else "py-spy",
        "record",
        "--pid",
        str(pid),
        "-o",
        str(options.py_spy),
        *shlex.split(options.py_spy_args),
    ]
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    if profiler.poll() is not None:
        error = profiler.stderr.read().decode() if profiler.stderr else ""
        raise RuntimeError(f"py-spy exited {profiler.returncode}: {error}")
    return profiler


def sample_until_done(
    options: argparse.Namespace,
    engine: Engine,
    worker: subprocess.Popen[bytes],
    feeder: Feeder,
) -> list[dict[str, float]]:
    """Sample RSS and progress until every message is processed; the samples."""
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    last_progress, last_change = -1, started
    with engine.connect() as connection:
        while True:
            now = time.monotonic()
            processed = int(connection.execute(PROGRESS).scalar_one())
            connection.rollback()
            user, system = cpu_seconds(worker.pid)
            samples.append(
                {
                    "t": now - started,
                    "processed": processed,
                    "rss": rss_bytes(worker.pid),
                    "cpu_s": user + system,
                    "cpu_user_s": user,
                    "cpu_sys_s": system,
                }
            )
            if processed != last_progress:
                last_progress, last_change = processed, now
            if processed >= options.messages:
                return samples
            if feeder.error is not None:
                raise RuntimeError(f"publishing failed: {feeder.error!r}") from feeder.error
            if worker.poll() is not None:
                raise RuntimeError(f"inbox-worker exited {worker.returncode} mid-run")
            if now - last_change > options.stall_timeout:
                raise RuntimeError(
                    f"nothing processed for {options.stall_timeout} s at {processed} messages"
                )
            time.sleep(max(0.0, options.sample_every - (time.monotonic() - now)))


def final_checks(
    options: argparse.Namespace, engine: Engine, topology: QueueTopology
) -> dict[str, Any]:
    """Exact counts, the claim time span, what is left in the queues."""
    with engine.connect() as connection:
        rows, distinct_refs, claims, span = connection.execute(FINAL_COUNTS).one()
    return {
        "rows": int(rows),
        "distinct_refs": int(distinct_refs),
        "claims": int(claims),
        "claim_span_s": float(span or 0.0),
        "left_in_queue": queue_depth(options.broker, topology.name),
        "left_in_dlq": queue_depth(options.broker, topology.dead_letter_queue),
    }


def report(
    options: argparse.Namespace,
    *,
    command: list[str],
    samples: list[dict[str, float]],
    result: dict[str, Any],
    version: str,
    out_dir: Path,
) -> ScenarioReport:
    """Figures, the table printed to stdout, the plot."""
    messages = options.messages
    warm = next(s for s in samples if s["processed"] >= WARM_UP_FRACTION * messages)
    end = samples[-1]
    after = [s for s in samples if s["t"] >= warm["t"]]
    peak = max(s["rss"] for s in after)
    growth = (end["rss"] - warm["rss"]) / warm["rss"] * 100
    peak_growth = (peak - warm["rss"]) / warm["rss"] * 100
    rate = (result["claims"] - 1) / result["claim_span_s"] if result["claim_span_s"] else 0.0
    sampled_rate = (end["processed"] - warm["processed"]) / max(1e-9, end["t"] - warm["t"])
    # The worker's own CPU per message after warm-up, against the wall time per message:
    # the rest of each message's time the worker waits (database, broker).
    cpu_us = (end["cpu_s"] - warm["cpu_s"]) / max(1, end["processed"] - warm["processed"]) * 1e6
    busy = (end["cpu_s"] - warm["cpu_s"]) / max(1e-9, end["t"] - warm["t"])
    system_share = (end["cpu_sys_s"] - warm["cpu_sys_s"]) / max(1e-9, end["cpu_s"] - warm["cpu_s"])
    exactly_once = (
        result["rows"] == messages
        and result["distinct_refs"] == messages
        and result["claims"] == messages
        and not result["left_in_queue"]
        and not result["left_in_dlq"]
    )
    print(f"\nS6 worker memory, {messages:,} messages, worker args {options.worker_args!r}")
    print(f"  RSS at warm-up ({warm['processed']:,} processed): {warm['rss'] / MB:8.1f} MB")
    print(f"  RSS at the end ({end['processed']:,} processed):  {end['rss'] / MB:8.1f} MB")
    print(f"  growth after warm-up: {growth:+.2f} %  (highest after warm-up {peak / MB:.1f} MB)")
    print(f"  peak RSS over the run (VmHWM): {result['vm_hwm_bytes'] / MB:.1f} MB")
    print(f"  rate: {rate:.0f} msg/s (claims' processed_at span {result['claim_span_s']:.1f} s)")
    print(
        f"  worker CPU: {cpu_us:.0f} us per message ({system_share * 100:.0f} % in the kernel), "
        f"{busy * 100:.0f} % of one core"
    )
    print(
        f"  rows {result['rows']:,}, distinct refs {result['distinct_refs']:,}, claims "
        f"{result['claims']:,}, left in queue {result['left_in_queue']}, in dlq "
        f"{result['left_in_dlq']}; worker exit code {result['exit_code']}"
    )
    figures = [
        Figure("RSS after warm-up (10 %)", warm["rss"] / MB, "MB"),
        Figure("RSS at the end", end["rss"] / MB, "MB"),
        Figure(
            "RSS growth after warm-up",
            growth,
            "%",
            f"< {GROWTH_TARGET_PERCENT:g}",
            growth < GROWTH_TARGET_PERCENT,
        ),
        Figure("highest RSS growth after warm-up", peak_growth, "%"),
        Figure("worker msg/s", rate, "msg/s"),
        Figure("worker CPU per message", cpu_us, "us"),
        Figure("worker CPU busy", busy * 100, "% of a core"),
        Figure(
            "processed exactly once",
            1.0 if exactly_once else 0.0,
            "",
            "== 1",
            exactly_once,
        ),
        Figure(
            "worker exit code after SIGTERM",
            float(-1 if result["exit_code"] is None else result["exit_code"]),
            "",
            "== 0",
            result["exit_code"] == 0,
        ),
    ]
    plots = []
    plot = plot_lines(
        out_dir / "s6_rss_vs_processed.png",
        f"S6: inbox-worker RSS over {messages:,} messages",
        "messages processed",
        "RSS (MB)",
        {"VmRSS": ([s["processed"] for s in samples], [s["rss"] / MB for s in samples])},
    )
    if plot:
        plots.append(plot)
    return ScenarioReport(
        SCENARIO,
        TITLE,
        {
            "database": make_url(options.database_url).render_as_string(hide_password=True),
            "server_version": version,
            "broker": Connection(options.broker).as_uri(),
            "messages": messages,
            "sample_every": options.sample_every,
            "worker_args": options.worker_args,
            "worker_command": command[1:],
            "ahead": options.ahead,
            "batch": options.batch,
        },
        figures,
        {
            "samples": samples,
            "warm_up_sample": warm,
            "end_sample": end,
            "sampled_rate_after_warm_up": sampled_rate,
            "cpu_us_per_message_after_warm_up": cpu_us,
            **result,
        },
        plots,
    )


if __name__ == "__main__":
    sys.exit(scenario_main(sys.modules[__name__]))
