"""NATS servers with JetStream on this machine: one for the edge's tests, three clustered
for node loss.

    with NatsCluster(3) as cluster:               # JetStream on every node, one cluster
        url = cluster.urls()                      # ["nats://127.0.0.1:4301", …]
        cluster.kill_node(cluster.nodes[0].name)  # SIGKILL: a crash
        cluster.start_node(cluster.nodes[0].name) # back, catching up from its peers

Each node is a ``nats-server -js`` process group of its own with its client, cluster and
monitoring ports on loopback and its store under a temporary directory; a watchdog kills
them if the process that started them dies first. Everything is killed and the directory
removed on :meth:`NatsCluster.stop`.

Run ``python tools/cluster/jetstream.py`` to start a cluster, print its URLs and hold it until
Ctrl-C (at most ``--hold`` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

from tools.cluster._process import ClusterError, Fatal, Watchdog, free_ports, kill_group, wait_until

__all__ = ["NATS_SERVER", "NatsCluster", "NatsNode"]

NATS_SERVER = os.environ.get("NATS_SERVER", shutil.which("nats-server") or "/usr/sbin/nats-server")
START_TIMEOUT = 30.0


@dataclass
class NatsNode:
    """One server: its name, ports, store and (while it runs) its process."""

    name: str
    client_port: int
    cluster_port: int
    monitor_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """True while the server's process is alive."""
        return self.process is not None and self.process.poll() is None

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>``."""
        return f"nats://127.0.0.1:{self.client_port}"

    def monitor(self, endpoint: str) -> dict[str, Any]:
        """A monitoring endpoint (``jsz``, ``routez`` …) as JSON."""
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.monitor_port}/{endpoint}", timeout=5
        ) as reply:
            data: dict[str, Any] = json.load(reply)
        return data


class NatsCluster:
    """Start, fault and tear down ``size`` JetStream servers, clustered when more than one."""

    def __init__(
        self,
        size: int = 3,
        *,
        first_port: int = 4301,
        max_payload: int | None = None,
        config: str = "",
    ) -> None:
        if not 1 <= size <= 5:
            raise ValueError(f"size must be 1..5 nodes, got {size}")
        if not Path(NATS_SERVER).exists():
            raise ClusterError(f"nats-server not found at {NATS_SERVER} (set NATS_SERVER)")
        self.max_payload = max_payload
        """The servers' ``max_payload`` in bytes (headers and body), None for the default."""
        self.config = config
        """More of the servers' configuration file (users and their permissions, say)."""
        self.root = Path(tempfile.mkdtemp(prefix="inbox-nats-cluster-"))
        self._watchdog = Watchdog(self.root)
        clients = free_ports(size, first_port)
        routes = free_ports(size, clients[-1] + 100)
        monitors = free_ports(size, routes[-1] + 100)
        self.nodes = [
            NatsNode(f"n{i + 1}", clients[i], routes[i], monitors[i], self.root / f"n{i + 1}")
            for i in range(size)
        ]

    def start(self) -> Self:
        """Start every node; return once each answers and (clustered) JetStream has a
        meta leader."""
        try:
            for node in self.nodes:
                self._spawn(node)
            for node in self.nodes:
                self._await(node)
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

    def urls(self) -> list[str]:
        """Every node's client URL (nats-py takes the list and fails over between them)."""
        return [node.url for node in self.nodes]

    def node(self, name: str) -> NatsNode:
        """The node called ``name``."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise ValueError(f"no node {name!r}")

    def stream_leader(self, stream: str) -> str | None:
        """The node that leads ``stream``'s Raft group now (None while it has none)."""
        for node in self.nodes:
            if not node.running:
                continue
            with contextlib.suppress(OSError, ValueError):
                jsz = node.monitor("jsz?streams=true")
                for account in jsz.get("account_details", []):
                    for detail in account.get("stream_detail", []):
                        if detail.get("name") == stream:
                            leader = detail.get("cluster", {}).get("leader")
                            return str(leader) if leader else None
        return None

    def kill_node(self, name: str) -> None:
        """SIGKILL a node: a crash, no goodbye to its peers or clients."""
        self._end(self.node(name))

    def start_node(self, name: str) -> None:
        """Start a killed node again (same store); return once it answers."""
        node = self.node(name)
        if node.running:
            raise ClusterError(f"node {name} is already running")
        self._spawn(node)
        self._await(node)

    def _end(self, node: NatsNode) -> None:
        if node.process is not None:
            kill_group(node.process)
            self._watchdog.forget(node.process)
            node.process = None

    def _spawn(self, node: NatsNode) -> None:
        node.directory.mkdir(parents=True, exist_ok=True)
        command = [
            NATS_SERVER,
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(node.client_port),
            "-m",
            str(node.monitor_port),
            "-n",
            node.name,
            "-sd",
            str(node.directory / "store"),
        ]
        if self.max_payload is not None or self.config:
            # No command-line flag for these: a config file.
            config = node.directory / "server.conf"
            limit = "" if self.max_payload is None else f"max_payload: {self.max_payload}\n"
            config.write_text(limit + self.config)
            command += ["-c", str(config)]
        if len(self.nodes) > 1:
            routes = ",".join(
                f"nats://127.0.0.1:{other.cluster_port}" for other in self.nodes if other != node
            )
            command += [
                "--cluster_name",
                "inbox",
                "--cluster",
                f"nats://127.0.0.1:{node.cluster_port}",
                "--routes",
                routes,
            ]
        with (node.directory / "server.out").open("ab") as out:
            node.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._watchdog.watch(node.process)

    def _await(self, node: NatsNode) -> None:
        def ready() -> bool:
            if not node.running:
                tail = (node.directory / "server.out").read_text(errors="replace")[-1500:]
                raise Fatal(f"nats-server {node.name} exited while starting:\n{tail}")
            jsz = node.monitor("jsz")
            if len(self.nodes) == 1:
                return True
            return bool(jsz.get("meta_cluster", {}).get("leader"))

        wait_until(ready, timeout=START_TIMEOUT, what=f"nats-server {node.name} ready", every=0.2)


def main(argv: list[str] | None = None) -> int:
    """Start a cluster, print its URLs, hold it until Ctrl-C or ``--hold`` seconds."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=3)
    parser.add_argument("--hold", type=float, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    with NatsCluster(args.size) as cluster:
        print(",".join(cluster.urls()), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
