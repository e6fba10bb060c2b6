"""A three-node MariaDB Galera cluster on this machine: multi-primary, every node writable.

    with GaleraCluster() as cluster:              # wsrep on, 3 nodes synced
        url = cluster.url(cluster.nodes[1])       # "mysql+pymysql://root@127.0.0.1:3402/inbox"
        cluster.kill_node("g2")                   # SIGKILL: a crash
        cluster.start_node("g2")                  # rejoins (IST from a peer's gcache)
        cluster.stop_node("g3")                   # leaves cleanly (SIGTERM), then start again

Each node is a ``mariadbd`` with ``--wsrep-on=ON`` and ``libgalera_smm.so``, its own client,
group-communication, IST and SST ports on loopback, and its data directory under a
temporary directory. Node 1 bootstraps the cluster (``--wsrep-new-cluster``), nodes 2 and 3
join it by SST (rsync). Start it as root: the servers run as the ``mysql`` user, as packaged
(the joiner's rsync daemon, started by root, would write as ``nobody``). A node started
again after a kill or a clean stop rejoins by IST when the others' gcache still holds what
it missed. A watchdog kills every server if the
process that started them dies first; :meth:`GaleraCluster.stop` kills them and removes
the directory.

The settings the inbox's guarantee needs (docs/cluster.md): ``binlog_format=ROW`` and
InnoDB (Galera replicates row events of InnoDB tables only), a primary key on every table
(the inbox's claim table has one: ``(message_id, handler)``), and ``wsrep_sync_wait`` with
the INSERT bit (4) so a claim waits until the node has applied every write set certified
before it: without it the claim is still decided by certification (a COMMIT failing with
1213), just after more conflicts.

Run ``python tools/cluster/galera.py`` to start a cluster, print its URLs and hold it until
Ctrl-C (at most ``--hold`` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import os
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

import pymysql

from tools.cluster._process import (
    ClusterError,
    Fatal,
    Watchdog,
    free_ports,
    kill_group,
    run,
    wait_until,
)

__all__ = ["GALERA_PROVIDER", "MARIADBD", "GaleraCluster", "GaleraNode"]

MARIADBD = os.environ.get("MARIADBD", shutil.which("mariadbd") or "/usr/sbin/mariadbd")
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
GALERA_PROVIDER = os.environ.get("GALERA_PROVIDER", "/usr/lib/galera/libgalera_smm.so")
SERVER_USER = os.environ.get("GALERA_USER", "mysql")
DATABASE = "inbox"
START_TIMEOUT = 90.0


@dataclass
class GaleraNode:
    """One node: its name, ports, directory and (while it runs) its process."""

    name: str
    port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """True while the server's process is alive (it may still be joining)."""
        return self.process is not None and self.process.poll() is None

    def connect(self, database: str | None = None) -> pymysql.Connection[pymysql.cursors.Cursor]:
        """A PyMySQL connection to this node (autocommit)."""
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            database=database,
            autocommit=True,
            connect_timeout=5,
            read_timeout=30,
        )

    def status(self, variable: str) -> str | None:
        """A ``wsrep_*`` status variable of this node (None if it does not answer)."""
        try:
            with self.connect() as connection, connection.cursor() as cursor:
                cursor.execute("SHOW GLOBAL STATUS LIKE %s", (variable,))
                row = cursor.fetchone()
        except pymysql.MySQLError:
            return None
        return None if row is None else str(row[1])

    @property
    def synced(self) -> bool:
        """True when the node is in the primary component and synced (writable)."""
        return (
            self.running
            and self.status("wsrep_local_state_comment") == "Synced"
            and self.status("wsrep_cluster_status") == "Primary"
        )


class GaleraCluster:
    """Start, fault and tear down ``size`` Galera nodes (see the module doc)."""

    def __init__(self, size: int = 3, *, first_port: int = 3401, sync_wait: int = 7) -> None:
        if not 1 <= size <= 5:
            raise ValueError(f"size must be 1..5 nodes, got {size}")
        for binary in (MARIADBD, GALERA_PROVIDER, INSTALL_DB):
            if not Path(binary).exists():
                raise ClusterError(f"{binary} not found (mariadb-server and galera-4 installed?)")
        self.sync_wait = sync_wait
        self.root = Path(tempfile.mkdtemp(prefix="inbox-galera-cluster-"))
        self._watchdog = Watchdog(self.root)
        ports = free_ports(4 * size, first_port)
        self.nodes = [
            GaleraNode(
                name=f"g{i + 1}",
                port=ports[i],
                gcomm_port=ports[size + i],
                ist_port=ports[2 * size + i],
                sst_port=ports[3 * size + i],
                directory=self.root / f"g{i + 1}",
            )
            for i in range(size)
        ]

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Bootstrap node 1, let the others join; return once all are synced and the
        database ``inbox`` exists."""
        try:
            first, *others = self.nodes
            self._install(first)
            self._spawn(first, bootstrap=True)
            self._await(first)
            with first.connect() as connection, connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
            for node in others:
                self._install(node)
                self._spawn(node)
                self._await(node)  # one SST at a time: the donor serves one joiner
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node and remove the cluster's directory."""
        for node in self.nodes:
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

    # -- addresses ---------------------------------------------------------------------

    def url(self, node: GaleraNode, driver: str = "pymysql") -> str:
        """The SQLAlchemy URL of database ``inbox`` on ``node``."""
        return f"mysql+{driver}://root@127.0.0.1:{node.port}/{DATABASE}?charset=utf8mb4"

    def node(self, name: str) -> GaleraNode:
        """The node called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise ValueError(f"no node {name!r}")

    def cluster_size(self) -> int:
        """``wsrep_cluster_size`` as a running node sees it (0 if none answers)."""
        for node in self.nodes:
            if node.running:
                size = node.status("wsrep_cluster_size")
                if size is not None:
                    return int(size)
        return 0

    # -- faults ------------------------------------------------------------------------

    def kill_node(self, name: str) -> None:
        """SIGKILL a node: a crash, no goodbye to its peers or clients."""
        self._end(self.node(name))

    def stop_node(self, name: str) -> None:
        """Shut a node down cleanly (SIGTERM): it leaves the cluster, then exits."""
        node = self.node(name)
        if node.process is None:
            raise ClusterError(f"node {name} is not running")
        with contextlib.suppress(ProcessLookupError):
            node.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(60)
        self._end(node)

    def isolate_node(self, name: str) -> None:
        """Cut ``name`` off from its peers (``gmcast.isolate=1``: Galera drops every
        group-communication connection of the node), a network split on loopback: the node
        alone is a non-primary component (every query fails with 1047), the other two stay
        primary."""
        self._provider_option(self.node(name), "gmcast.isolate=1")
        wait_until(
            lambda: self.node(name).status("wsrep_cluster_status") == "non-Primary",
            timeout=30,
            what=f"{name} cut off",
            every=0.2,
        )

    def heal_node(self, name: str) -> None:
        """End :meth:`isolate_node`: the node rejoins (IST) and syncs."""
        node = self.node(name)
        self._provider_option(node, "gmcast.isolate=0")
        self._await(node)

    def _provider_option(self, node: GaleraNode, option: str) -> None:
        with node.connect() as connection, connection.cursor() as cursor:
            cursor.execute("SET GLOBAL wsrep_provider_options = %s", (option,))

    def start_node(self, name: str) -> str:
        """Start a stopped or killed node again; return once it is synced, with how it
        caught up ("IST" or "SST", from its error log)."""
        node = self.node(name)
        if node.running:
            raise ClusterError(f"node {name} is already running")
        log = node.directory / "error.log"
        seen = log.stat().st_size if log.exists() else 0
        self._spawn(node)
        self._await(node)
        added = log.read_text(errors="replace")[seen:] if log.exists() else ""
        return "SST" if "State transfer required" in added and "IST" not in added else "IST"

    # -- internals ---------------------------------------------------------------------

    def _install(self, node: GaleraNode) -> None:
        (node.directory / "data").mkdir(parents=True, exist_ok=True)
        # The server runs as the mysql user, as packaged: its SST scripts and the joiner's
        # rsync daemon then write the data directory as that user (rsync started by root
        # would drop to "nobody" and fail).
        self.root.chmod(0o755)
        run(
            [
                INSTALL_DB,
                "--no-defaults",
                f"--datadir={node.directory / 'data'}",
                f"--user={SERVER_USER}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            timeout=120,
        )
        run(["chown", "-R", f"{SERVER_USER}:{SERVER_USER}", str(node.directory)])

    def _spawn(self, node: GaleraNode, *, bootstrap: bool = False) -> None:
        d = node.directory
        addresses = ",".join(f"127.0.0.1:{n.gcomm_port}" for n in self.nodes)
        provider_options = ";".join(
            [
                f"gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm_port}",
                f"ist.recv_addr=127.0.0.1:{node.ist_port}",
                "gcache.size=64M",
                # Quick to notice a dead peer on loopback (defaults are for WANs).
                "evs.suspect_timeout=PT3S",
                "evs.inactive_timeout=PT6S",
                "evs.keepalive_period=PT0.5S",
                "evs.inactive_check_period=PT0.5S",
                "pc.wait_prim_timeout=PT10S",
            ]
        )
        command = [
            MARIADBD,
            "--no-defaults",
            f"--user={SERVER_USER}",
            f"--datadir={d / 'data'}",
            f"--socket={d / 'mysqld.sock'}",
            f"--pid-file={d / 'mysqld.pid'}",
            f"--log-error={d / 'error.log'}",
            "--bind-address=127.0.0.1",
            f"--port={node.port}",
            "--skip-name-resolve",
            "--performance-schema=OFF",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=2",
            "--innodb-autoinc-lock-mode=2",
            "--default-storage-engine=InnoDB",
            "--binlog-format=ROW",
            "--wsrep-on=ON",
            f"--wsrep-provider={GALERA_PROVIDER}",
            f"--wsrep-provider-options={provider_options}",
            "--wsrep-cluster-name=inbox",
            f"--wsrep-cluster-address=gcomm://{addresses}",
            f"--wsrep-node-name={node.name}",
            f"--wsrep-node-address=127.0.0.1:{node.gcomm_port}",
            f"--wsrep-sst-receive-address=127.0.0.1:{node.sst_port}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sync-wait={self.sync_wait}",
            "--wsrep-slave-threads=2",
            "--max-connections=200",
        ]
        if bootstrap:
            command.append("--wsrep-new-cluster")
        env = dict(os.environ)
        env["PATH"] = f"/usr/bin:/usr/sbin:/bin:/sbin:{env.get('PATH', '')}"
        with (d / "server.out").open("ab") as out:
            node.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=d,
            )
        self._watchdog.watch(node.process)

    def _await(self, node: GaleraNode) -> None:
        def synced() -> bool:
            if not node.running:
                log = node.directory / "error.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise Fatal(f"mariadbd {node.name} exited while starting:\n{tail}")
            return node.synced

        wait_until(synced, timeout=START_TIMEOUT, what=f"Galera node {node.name} synced")

    def _end(self, node: GaleraNode) -> None:
        if node.process is not None:
            # The rsync SST helpers run in the node's process group: killed with it.
            kill_group(node.process)
            self._watchdog.forget(node.process)
            node.process = None


def main(argv: list[str] | None = None) -> int:
    """Start a cluster, print its URLs, hold it until Ctrl-C or ``--hold`` seconds."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=3)
    parser.add_argument("--hold", type=float, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    with GaleraCluster(args.size) as cluster:
        for node in cluster.nodes:
            print(cluster.url(node), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
