"""A PostgreSQL primary and a streaming standby on this machine, for failover runs.

    with PostgresPair(synchronous=True) as pair:   # node1 primary :5441, node2 standby :5442
        engine = create_engine(pair.url())          # multi-host, target_session_attrs=read-write
        pair.failover()                             # SIGKILL the primary, promote the standby,
                                                    # rebuild the old one as the new standby

Both servers run the machine's PostgreSQL binaries (/usr/lib/postgresql/<version>/bin) as
the ``postgres`` user, each in a process group of its own, with their own data directories
and sockets under a temporary directory and their own loopback ports: the machine's main
cluster is never touched. The standby is a ``pg_basebackup`` of the primary with a
replication slot, streaming with ``hot_standby``.

* ``synchronous=True``: the primary runs with ``synchronous_standby_names = '*'`` and
  ``synchronous_commit = remote_apply``: a COMMIT returns only once the standby has applied
  it. A primary left without a standby blocks commits until one attaches (never a commit
  held by one server only).
* ``synchronous=False``: ``synchronous_commit = on`` (local flush): a COMMIT returns before
  the standby has it, so a crash of the primary can take acknowledged commits with it.

Run ``python tools/cluster/postgres.py [--async]`` to start a pair, print its URL and hold it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.cluster._process import (
    ClusterError,
    Fatal,
    Watchdog,
    free_ports,
    kill_tree,
    port_free,
    run,
    wait_until,
)

__all__ = ["PgNode", "PostgresPair"]

USER = "postgres"
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "60",
    "shared_buffers": "32MB",
    "wal_level": "replica",
    "max_wal_senders": "5",
    "max_replication_slots": "5",
    "hot_standby": "on",
    "wal_keep_size": "64MB",
    "wal_retrieve_retry_interval": "200ms",  # promote at once after the primary dies
    "logging_collector": "off",
    "log_min_messages": "warning",
}


def pg_bin() -> Path:
    """The newest /usr/lib/postgresql/<version>/bin, or $PG_BIN."""
    if "PG_BIN" in os.environ:
        return Path(os.environ["PG_BIN"])
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not versions:
        raise ClusterError("no PostgreSQL binaries under /usr/lib/postgresql (set PG_BIN)")
    return versions[-1]


@dataclass
class PgNode:
    """One server: its name (also its ``application_name`` as a standby), port and data."""

    name: str
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """True while the server's process is alive."""
        return self.process is not None and self.process.poll() is None

    @property
    def data(self) -> Path:
        """The data directory."""
        return self.directory / "data"


class PostgresPair:
    """Start, fail over and tear down a primary and a standby (see the module doc)."""

    def __init__(self, *, synchronous: bool = True, first_port: int = 5441) -> None:
        self.synchronous = synchronous
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="inbox-pg-pair-"))
        self._watchdog = Watchdog(self.root)
        account = pwd.getpwnam(USER)
        self._ids = account.pw_uid, account.pw_gid
        os.chown(self.root, *self._ids)
        self.root.chmod(0o755)
        ports = free_ports(2, first_port)
        self.nodes = [
            PgNode(f"node{i + 1}", port, self.root / f"node{i + 1}") for i, port in enumerate(ports)
        ]
        self.primary, self.standby = self.nodes
        self.promotions = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """initdb and start the primary, clone and start the standby, wait for streaming."""
        try:
            self._as_postgres(self.bin / "initdb", "-D", self.primary.data, "-U", USER,
                              "-A", "trust", "--no-sync", "-E", "UTF8")  # fmt: skip
            conf = self.primary.data / "postgresql.conf"
            with conf.open("a") as f:
                f.writelines(f"{k} = {v}\n" for k, v in SETTINGS.items())
            with (self.primary.data / "pg_hba.conf").open("a") as f:
                f.write("host replication all 127.0.0.1/32 trust\n")
            self._launch(self.primary)
            self._clone(self.standby, source=self.primary)
            self._launch(self.standby)
            self._await_streaming()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill both servers and remove every file the pair wrote."""
        for node in self.nodes:
            if node.process is not None:
                self._end(node)
        self._watchdog.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses and queries ---------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """A multi-host SQLAlchemy URL: libpq tries both servers and keeps the writable one."""
        hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in self.nodes)
        return (
            f"postgresql+psycopg://{USER}@/{database}?{hosts}"
            "&target_session_attrs=read-write&connect_timeout=5"
        )

    def node_url(self, node: PgNode, database: str = "postgres") -> str:
        """A URL for one server alone."""
        return f"postgresql+psycopg://{USER}@127.0.0.1:{node.port}/{database}"

    def sql(self, node: PgNode, query: str, timeout: float = 30.0) -> str:
        """Run ``query`` with psql on ``node``; return its unaligned output."""
        return run(
            [str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(node.port), "-U", USER,
             "-d", "postgres", "-XAtqc", query],
            timeout=timeout,
        ).strip()  # fmt: skip

    def replication_state(self) -> list[tuple[str, str, str]]:
        """(standby name, state, sync_state) of every standby streaming from the primary."""
        out = self.sql(
            self.primary, "SELECT application_name, state, sync_state FROM pg_stat_replication"
        )
        return [(a, b, c) for a, b, c in (line.split("|") for line in out.splitlines() if line)]

    # -- faults ------------------------------------------------------------------------

    def kill_primary(self) -> None:
        """SIGKILL every process of the primary at once: a crash, nothing flushed or sent."""
        if self.primary.process is None:
            raise ClusterError("the primary is not running")
        self._end(self.primary)

    def promote(self) -> None:
        """Promote the standby; the roles swap (the old primary is left stopped)."""
        try:
            self._as_postgres(
                self.bin / "pg_ctl", "promote", "-w", "-t", "30", "-D", self.standby.data
            )
        except ClusterError:
            # A request that lands while the server restarts its processes is dropped.
            if self.sql(self.standby, "SELECT pg_is_in_recovery()") != "t":
                raise
            self._as_postgres(
                self.bin / "pg_ctl", "promote", "-w", "-t", "60", "-D", self.standby.data
            )
        wait_until(
            lambda: self.sql(self.standby, "SELECT pg_is_in_recovery()") == "f",
            timeout=60,
            what=f"{self.standby.name} promoted",
        )
        self.primary, self.standby = self.standby, self.primary
        self.promotions += 1

    def rebuild_standby(self) -> None:
        """Replace the stopped node's data with a fresh clone of the primary and stream again
        (with ``synchronous=True`` commits resume only once it streams)."""
        if self.standby.process is not None:
            self._end(self.standby)
        shutil.rmtree(self.standby.data, ignore_errors=True)
        with contextlib.suppress(ClusterError):  # a slot left from an earlier clone
            self.sql(self.primary, f"SELECT pg_drop_replication_slot('{self.standby.name}')")
        self._clone(self.standby, source=self.primary)
        self._launch(self.standby)
        self._await_streaming()

    def failover(self) -> float:
        """Crash the primary, promote the standby, rebuild the old primary as the standby.
        Returns the seconds the pair had no writable server."""
        started = time.monotonic()
        self.kill_primary()
        self.promote()
        unavailable = time.monotonic() - started
        self.rebuild_standby()
        return unavailable

    # -- internals ---------------------------------------------------------------------

    def _end(self, node: PgNode) -> None:
        if node.process is not None:
            kill_tree(node.process)
            self._watchdog.forget(node.process)
            node.process = None

    def _role_settings(self, node: PgNode) -> list[str]:
        settings = [f"port={node.port}", f"unix_socket_directories={node.directory}",
                    f"cluster_name=inbox-{node.name}"]  # fmt: skip
        if self.synchronous:
            # Read by a primary only; a standby promoted later keeps the same rule.
            settings += ["synchronous_standby_names=*", "synchronous_commit=remote_apply"]
        return [arg for setting in settings for arg in ("-c", setting)]

    def _launch(self, node: PgNode) -> None:
        log = node.directory / "server.log"
        wait_until(lambda: port_free(node.port), timeout=30, what=f"port {node.port} free")
        with log.open("ab") as out:
            os.chown(log, *self._ids)
            node.process = subprocess.Popen(
                [str(self.bin / "postgres"), "-D", str(node.data), *self._role_settings(node)],
                user=self._ids[0],
                group=self._ids[1],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._watchdog.watch(node.process)

        def ready() -> bool:
            if not node.running:
                tail = log.read_text(errors="replace")[-1500:]
                raise Fatal(f"PostgreSQL {node.name} exited while starting:\n{tail}")
            run([str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(node.port)])
            return True

        wait_until(ready, timeout=60, what=f"{node.name} accepting connections", every=0.3)

    def _clone(self, node: PgNode, source: PgNode) -> None:
        node.directory.mkdir(exist_ok=True)
        os.chown(node.directory, *self._ids)
        conninfo = f"host=127.0.0.1 port={source.port} user={USER} application_name={node.name}"
        self._as_postgres(self.bin / "pg_basebackup", "-D", node.data, "-d", conninfo,
                          "-X", "stream", "-R", "-C", "-S", node.name, "-c", "fast")  # fmt: skip

    def _await_streaming(self) -> None:
        wanted = "sync" if self.synchronous else "async"
        wait_until(
            lambda: (self.standby.name, "streaming", wanted) in self.replication_state(),
            timeout=60,
            what=f"{self.standby.name} streaming ({wanted})",
        )

    def _as_postgres(self, *command: str | Path) -> None:
        done = subprocess.run(
            [str(part) for part in command],
            user=self._ids[0],
            group=self._ids[1],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterError(f"{Path(str(command[0])).name} failed: {done.stderr.strip()[-800:]}")


def main(argv: list[str] | None = None) -> int:
    """Start a pair, print its URL, hold it until Ctrl-C or ``--hold`` seconds."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--async", dest="synchronous", action="store_false")
    parser.add_argument("--hold", type=float, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    with PostgresPair(synchronous=args.synchronous) as pair:
        print(pair.url(), flush=True)
        print("replication:", pair.replication_state(), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
