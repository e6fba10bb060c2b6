"""Three PostgreSQL nodes managed by Patroni, one etcd, on this machine: automatic failover
and switchover, with or without Patroni's synchronous mode.

    with PatroniCluster(synchronous=True) as cluster:
        engine = create_engine(cluster.url())     # multi-host, target_session_attrs=read-write
        cluster.failover()                        # SIGKILL the leader (Patroni and PostgreSQL):
                                                  # a replica takes over once the leader key
                                                  # expires (ttl); the old leader rejoins
        cluster.switchover()                      # a planned change of leader (REST API)

etcd and the three Patroni processes run with their own loopback ports and directories under
a temporary directory; PostgreSQL (the machine's /usr/lib/postgresql/<version>/bin) runs as
the ``postgres`` user under Patroni (so start it as root, as :mod:`tools.cluster.postgres`).
A watchdog kills everything if the process that started the cluster dies first.

* ``synchronous=True``: ``synchronous_mode: true`` (Patroni names one replica in
  ``synchronous_standby_names`` and fails over only to it) and ``synchronous_commit =
  remote_apply``: a COMMIT returns once that replica applied it.
* ``synchronous=False``: asynchronous streaming; Patroni may promote a replica that lacks
  acknowledged commits (up to ``maximum_lag_on_failover`` bytes behind).

Run ``python tools/cluster/patroni.py [--async]`` to start a cluster, print its URL and hold it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psycopg

from tools.cluster._process import (
    ClusterError,
    Fatal,
    Watchdog,
    free_ports,
    freeze_and_kill,
    kill_group,
    wait_until,
)
from tools.cluster.postgres import USER, pg_bin

__all__ = ["ETCD", "PATRONI", "PatroniCluster", "PatroniNode"]

PATRONI = shutil.which("patroni") or "/usr/bin/patroni"
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
TTL = 10
LOOP_WAIT = 1
RETRY_TIMEOUT = 4


@dataclass
class PatroniNode:
    """One Patroni member: its name, PostgreSQL and REST ports, directory and process."""

    name: str
    port: int
    rest_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """True while the Patroni process is alive."""
        return self.process is not None and self.process.poll() is None

    def rest(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
        """A request to this member's REST API: (status, body)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rest_port}/{path}",
            data=None if body is None else json.dumps(body).encode(),
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


class PatroniCluster:
    """Start, fail over, switch over and tear down three Patroni members (module doc)."""

    def __init__(self, *, synchronous: bool = True, size: int = 3, first_port: int = 5451) -> None:
        for binary in (PATRONI, ETCD):
            if not Path(binary).exists():
                raise ClusterError(f"{binary} not found (apt-get install patroni etcd-server)")
        self.synchronous = synchronous
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="inbox-patroni-"))
        self._watchdog = Watchdog(self.root)
        account = pwd.getpwnam(USER)
        self._ids = account.pw_uid, account.pw_gid
        os.chown(self.root, *self._ids)
        self.root.chmod(0o755)
        ports = free_ports(size, first_port)
        rest = free_ports(size, 8101)
        self.etcd_client, self.etcd_peer = free_ports(2, 2391)
        self.nodes = [
            PatroniNode(f"pg{i + 1}", ports[i], rest[i], self.root / f"pg{i + 1}")
            for i in range(size)
        ]
        self.etcd: subprocess.Popen[bytes] | None = None
        self.promotions = 0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start etcd and every member; return once there is a leader and every replica
        streams (one of them synchronous with ``synchronous=True``)."""
        try:
            self._start_etcd()
            for node in self.nodes:
                self._spawn(node)
                if node is self.nodes[0]:
                    wait_until(lambda: self.leader() is not None, timeout=90, what="a leader")
            self._await_replicas()
            self._watch_postmasters()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every member (PostgreSQL with it) and etcd; remove the directory."""
        for node in self.nodes:
            self._end(node)
        if self.etcd is not None:
            kill_group(self.etcd)
            self._watchdog.forget(self.etcd)
            self.etcd = None
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

    # -- addresses and state -----------------------------------------------------------

    def url(self, database: str = "postgres") -> str:
        """The multi-host SQLAlchemy URL docs/cluster.md recommends."""
        hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in self.nodes)
        return (
            f"postgresql+psycopg://{USER}@/{database}?{hosts}"
            "&target_session_attrs=read-write&connect_timeout=5"
        )

    def members(self) -> list[dict[str, Any]]:
        """Patroni's view of the members (name, role, state, lag), from any running one."""
        for node in self.nodes:
            if node.running:
                with contextlib.suppress(OSError, ValueError):
                    status, body = node.rest("cluster")
                    if status == 200:
                        members: list[dict[str, Any]] = json.loads(body)["members"]
                        return members
        return []

    def leader(self) -> str | None:
        """The name of the member that leads (and runs PostgreSQL as primary) now."""
        for member in self.members():
            if member.get("role") == "leader" and member.get("state") == "running":
                return str(member["name"])
        return None

    def node(self, name: str) -> PatroniNode:
        """The member called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise ValueError(f"no member {name!r}")

    def writable_after(self, started: float, timeout: float = 120.0) -> float:
        """Seconds from ``started`` until a write succeeds through the multi-host URL."""
        conninfo = " ".join(
            [
                f"host={','.join('127.0.0.1' for _ in self.nodes)}",
                f"port={','.join(str(n.port) for n in self.nodes)}",
                f"user={USER} dbname=postgres target_session_attrs=read-write",
                "connect_timeout=2",
            ]
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(conninfo, autocommit=True) as connection:
                    connection.execute("SET statement_timeout = '2s'")
                    connection.execute("SELECT txid_current()")
                return time.monotonic() - started
            except psycopg.Error:
                time.sleep(0.05)
        raise ClusterError(f"no writable leader {timeout:g} s after the fault")

    # -- faults ------------------------------------------------------------------------

    def failover(self) -> float:
        """SIGKILL the leader's Patroni and PostgreSQL at once; wait for a new leader and a
        write through the multi-host URL; start the old leader again (it rejoins as a
        replica, rewound if it must be). Returns the seconds without a writable server."""
        old = self.leader()
        if old is None:
            raise ClusterError("no leader to fail over from")
        started = time.monotonic()
        self._end(self.node(old))
        wait_until(
            lambda: self.leader() not in (None, old), timeout=120, what="a new leader", every=0.2
        )
        unavailable = self.writable_after(started)
        self.promotions += 1
        self._spawn(self.node(old))
        self._await_replicas()
        self._watch_postmasters()
        return unavailable

    def switchover(self) -> float:
        """A planned switchover through the leader's REST API; returns the seconds without a
        writable server (what the workers stall)."""
        old = self.leader()
        if old is None:
            raise ClusterError("no leader to switch over from")
        started = time.monotonic()
        status, body = self.node(old).rest("switchover", {"leader": old})
        if status != 200:
            raise ClusterError(f"switchover refused ({status}): {body}")
        wait_until(
            lambda: self.leader() not in (None, old), timeout=120, what="the new leader", every=0.2
        )
        unavailable = self.writable_after(started)
        self.promotions += 1
        self._await_replicas()
        self._watch_postmasters()
        return unavailable

    # -- internals ---------------------------------------------------------------------

    def _await_replicas(self) -> None:
        def streaming() -> bool:
            members = self.members()
            replicas = [m for m in members if m.get("role") != "leader"]
            if len(members) != len(self.nodes) or not all(
                m.get("state") in ("running", "streaming") for m in members
            ):
                return False
            if self.synchronous:
                return any(m.get("role") == "sync_standby" for m in replicas)
            return True

        wait_until(streaming, timeout=120, what="every replica streaming", every=0.3)

    def _start_etcd(self) -> None:
        directory = self.root / "etcd"
        directory.mkdir()
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        client = f"http://127.0.0.1:{self.etcd_client}"
        with (directory / "etcd.out").open("ab") as out:
            self.etcd = subprocess.Popen(
                [ETCD, "--name", "e1", "--data-dir", str(directory / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"e1={peer}", "--log-level", "warn"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        self._watchdog.watch(self.etcd)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client}/health", timeout=2) as reply:
                return bool(json.load(reply).get("health") == "true")

        wait_until(healthy, timeout=30, what="etcd healthy", every=0.2)

    def _config(self, node: PatroniNode) -> str:
        parameters: dict[str, Any] = {
            "wal_level": "replica",
            "hot_standby": "on",
            "wal_log_hints": "on",  # pg_rewind of a failed leader
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "wal_keep_size": "64MB",
            "max_connections": 60,
            "shared_buffers": "32MB",
            "synchronous_commit": "remote_apply" if self.synchronous else "on",
        }
        config = {
            "scope": f"inbox-{self.root.name[-6:]}",
            "name": node.name,
            "log": {"level": "WARNING", "dir": str(node.directory)},
            "restapi": {
                "listen": f"127.0.0.1:{node.rest_port}",
                "connect_address": f"127.0.0.1:{node.rest_port}",
            },
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_client}"},
            "bootstrap": {
                "dcs": {
                    "ttl": TTL,
                    "loop_wait": LOOP_WAIT,
                    "retry_timeout": RETRY_TIMEOUT,
                    "maximum_lag_on_failover": 16 * 1024 * 1024,
                    "synchronous_mode": self.synchronous,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": parameters,
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.port}",
                "connect_address": f"127.0.0.1:{node.port}",
                "data_dir": str(node.directory / "data"),
                "bin_dir": str(self.bin),
                "pgpass": str(node.directory / "pgpass"),
                "authentication": {
                    "superuser": {"username": USER},
                    "replication": {"username": USER},
                    "rewind": {"username": USER},
                },
                "parameters": {"unix_socket_directories": str(node.directory)},
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }
        return json.dumps(config, indent=1)  # JSON is YAML

    def _spawn(self, node: PatroniNode) -> None:
        node.directory.mkdir(exist_ok=True)
        os.chown(node.directory, *self._ids)
        node.directory.chmod(0o700)
        config = node.directory / "patroni.yml"
        config.write_text(self._config(node))
        os.chown(config, *self._ids)
        log = node.directory / "patroni.out"
        with log.open("ab") as out:
            os.chown(log, *self._ids)
            node.process = subprocess.Popen(
                [PATRONI, str(config)],
                user=self._ids[0],
                group=self._ids[1],
                cwd=node.directory,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._watchdog.watch(node.process)

        def answers() -> bool:
            if not node.running:
                tail = log.read_text(errors="replace")[-1500:]
                raise Fatal(f"patroni {node.name} exited:\n{tail}")
            return node.rest("health")[0] in (200, 503)

        wait_until(answers, timeout=60, what=f"patroni {node.name} REST API", every=0.3)

    def _postmaster(self, node: PatroniNode) -> int | None:
        """The pid of the PostgreSQL that ``node``'s Patroni started, if it runs."""
        try:
            pid = int((node.directory / "data" / "postmaster.pid").read_text().split()[0])
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            return None
        return pid if str(node.directory).encode() in command else None

    def _end(self, node: PatroniNode) -> None:
        # Patroni and the PostgreSQL it runs at one instant: the postmaster is detached from
        # Patroni (not its child, not in its group) and its backends leave every group.
        pids = [p for p in (self._postmaster(node),) if p is not None]
        if node.process is not None:
            pids.append(node.process.pid)
        freeze_and_kill(pids)
        if node.process is not None:
            node.process.wait(30)
            self._watchdog.forget(node.process)
            node.process = None
        self._watch_postmasters()

    def _watch_postmasters(self) -> None:
        """Have the watchdog kill the detached postmasters too."""
        self._watchdog.watch_pids(
            {p for n in self.nodes if n.running and (p := self._postmaster(n)) is not None}
        )


def main(argv: list[str] | None = None) -> int:
    """Start a cluster, print its URL, hold it until Ctrl-C or ``--hold`` seconds."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--async", dest="synchronous", action="store_false")
    parser.add_argument("--hold", type=float, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    with PatroniCluster(synchronous=args.synchronous) as cluster:
        print(cluster.url(), flush=True)
        print(json.dumps(cluster.members()), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
