"""A three-node RabbitMQ cluster on this machine, for failover tests and chaos runs.

    with RabbitCluster() as cluster:              # nodes inbox-c1@localhost .. c3, quorum-ready
        url = cluster.url("my-vhost")             # "amqp://…:5681/my-vhost;amqp://…:5682/…;…"
        cluster.kill_node(cluster.leader("ops", "my-vhost"))
        cluster.start_node(...)

Each node runs as a process group of its own (``rabbitmq-server`` from /usr/lib/rabbitmq)
with its own node name, AMQP and distribution ports, data and log directories under a
temporary directory, and an Erlang cookie of the cluster's own (``HOME`` points there, so
neither the machine's main node nor its cookie is touched; they only share ``epmd``). Nodes
2 and 3 join node 1 at their first boot (classic-config peer discovery). Everything the
cluster started is killed and its directory removed on :meth:`RabbitCluster.stop`.

Run ``python tools/cluster/rabbit.py`` to start a cluster, print its URL and hold it until
Ctrl-C (at most ``--hold`` seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
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
    kill_group,
    run,
    wait_until,
)

__all__ = ["RabbitCluster", "RabbitNode"]

RABBIT_BIN = Path(os.environ.get("RABBITMQ_BIN", "/usr/lib/rabbitmq/bin"))
# One scheduler each and no busy-waiting: three nodes share two cores with everything else.
ERL_ARGS = "+S 1:1 +A 4 +sbwt none +sbwtdcpu none +sbwtdio none"
START_TIMEOUT = 120.0


@dataclass
class RabbitNode:
    """One node: its name, ports, directory and (while it runs) its process."""

    name: str
    amqp_port: int
    dist_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """True while the node's process is alive (it may still be booting)."""
        return self.process is not None and self.process.poll() is None

    def amqp_url(self, vhost: str = "") -> str:
        """``amqp://guest:guest@127.0.0.1:<port>/<vhost>`` for this node alone."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/{vhost}"


class RabbitCluster:
    """Start, fault and tear down ``size`` clustered RabbitMQ nodes (see the module doc)."""

    def __init__(self, size: int = 3, *, first_port: int = 5681, prefix: str = "inbox-c") -> None:
        if not 1 <= size <= 9:
            raise ValueError(f"size must be 1..9 nodes, got {size}")
        if not (RABBIT_BIN / "rabbitmq-server").exists():
            raise ClusterError(f"rabbitmq-server not found in {RABBIT_BIN} (set RABBITMQ_BIN)")
        self.root = Path(tempfile.mkdtemp(prefix="inbox-rabbit-cluster-"))
        self._watchdog = Watchdog(self.root)
        ports = free_ports(size, first_port)
        tag = secrets.token_hex(2)
        self.nodes = [
            RabbitNode(
                name=f"{prefix}{i + 1}-{tag}@localhost",
                amqp_port=port,
                dist_port=free_ports(1, port + 20000)[0],
                directory=self.root / f"node{i + 1}",
            )
            for i, port in enumerate(ports)
        ]
        cookie = self.root / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        """Start node 1, then the others (which join it); return once all run in one cluster."""
        try:
            first, *others = self.nodes
            self._spawn(first, peers=[])
            self._await(first)
            for node in others:
                self._spawn(node, peers=[first, node])
            for node in others:
                self._await(node)
            wait_until(
                lambda: len(self.running_nodes()) == len(self.nodes),
                timeout=60,
                what="all nodes in one cluster",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill every node this cluster started and remove its directory."""
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

    def url(self, vhost: str = "") -> str:
        """Every node's AMQP URL, ``;``-separated: kombu's list of failover alternates."""
        return ";".join(node.amqp_url(vhost) for node in self.nodes)

    def node(self, name: str) -> RabbitNode:
        """The node called ``name`` (ValueError if none is)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise ValueError(f"no node {name!r} in this cluster ({[n.name for n in self.nodes]})")

    def ctl(self, *args: str, node: RabbitNode | None = None, timeout: float = 60.0) -> str:
        """``rabbitmqctl`` against ``node`` (default: the first node that is running)."""
        target = node or next((n for n in self.nodes if n.running), None)
        if target is None:
            raise ClusterError("no node of the cluster is running")
        return self._tool("rabbitmqctl", "-n", target.name, *args, timeout=timeout)

    def running_nodes(self) -> list[str]:
        """Names of the nodes the cluster itself reports as running."""
        status = json.loads(self.ctl("cluster_status", "--formatter", "json"))
        return sorted(status.get("running_nodes", []))

    def leader(self, queue: str, vhost: str) -> str:
        """The node that leads quorum queue ``queue`` in ``vhost`` now."""
        rows = json.loads(
            self.ctl("list_queues", "-p", vhost, "name", "leader", "--formatter", "json")
        )
        for row in rows:
            if row.get("name") == queue and row.get("leader"):
                return str(row["leader"])
        raise ClusterError(f"queue {queue!r} in vhost {vhost!r} has no leader (or is not quorum)")

    # -- faults ------------------------------------------------------------------------

    def stop_node(self, name: str) -> None:
        """Stop a node cleanly (``rabbitmqctl stop``): its clients see their connections close."""
        node = self.node(name)
        self._tool("rabbitmqctl", "-n", node.name, "stop", timeout=120)
        if node.process is not None:
            node.process.wait(60)
            self._end(node)  # the wrapper's leftovers, if any

    def kill_node(self, name: str) -> None:
        """SIGKILL a node's whole process group: a crash, no goodbye to its peers or clients."""
        node = self.node(name)
        if node.process is None:
            raise ClusterError(f"node {name} is not running")
        self._end(node)

    def start_node(self, name: str) -> None:
        """Start a stopped or killed node again; return once it runs in the cluster."""
        node = self.node(name)
        if node.running:
            raise ClusterError(f"node {name} is already running")
        self._spawn(node, peers=[])
        self._await(node)
        wait_until(
            lambda: name in self.running_nodes(), timeout=60, what=f"{name} back in the cluster"
        )

    # -- internals ---------------------------------------------------------------------

    def _end(self, node: RabbitNode) -> None:
        if node.process is not None:
            kill_group(node.process)
            self._watchdog.forget(node.process)
            node.process = None

    def _env(self, node: RabbitNode | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env |= {
            "HOME": str(self.root),  # the cluster's own .erlang.cookie
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_CONF_ENV_FILE": str(self.root / "rabbitmq-env.conf"),
        }
        if node is not None:
            d = node.directory
            env |= {
                "RABBITMQ_NODENAME": node.name,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(node.amqp_port),
                "RABBITMQ_DIST_PORT": str(node.dist_port),
                "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
                "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
                "RABBITMQ_LOG_BASE": str(d / "log"),
                "RABBITMQ_PID_FILE": str(d / "node.pid"),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": ERL_ARGS,
            }
        return env

    def _spawn(self, node: RabbitNode, peers: list[RabbitNode]) -> None:
        d = node.directory
        d.mkdir(parents=True, exist_ok=True)
        (self.root / "rabbitmq-env.conf").touch()
        (d / "enabled_plugins").write_text("[].\n")
        lines = [
            f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}",
            "loopback_users.guest = true",
            "log.console = true",
            "log.console.level = warning",
            "log.file.level = info",
        ]
        if peers:
            lines.append("cluster_formation.peer_discovery_backend = classic_config")
            lines += [
                f"cluster_formation.classic_config.nodes.{i} = {peer.name}"
                for i, peer in enumerate(peers, 1)
            ]
        (d / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        with (d / "server.out").open("ab") as out:
            node.process = subprocess.Popen(
                [str(RABBIT_BIN / "rabbitmq-server")],
                env=self._env(node),
                cwd=d,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._watchdog.watch(node.process)

    def _await(self, node: RabbitNode) -> None:
        def booted() -> bool:
            if not node.running:
                tail = (node.directory / "server.out").read_text(errors="replace")[-1500:]
                raise Fatal(f"RabbitMQ node {node.name} exited while booting:\n{tail}")
            self._tool("rabbitmqctl", "-n", node.name, "await_startup", "--timeout", "5")
            return True

        wait_until(booted, timeout=START_TIMEOUT, what=f"node {node.name} booted", every=1.0)

    def _tool(self, tool: str, *args: str, timeout: float = 60.0) -> str:
        return run([str(RABBIT_BIN / tool), *args], env=self._env(), timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    """Start a cluster, print its URL, hold it until Ctrl-C or ``--hold`` seconds."""
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=3)
    parser.add_argument("--hold", type=float, default=600.0, help="seconds (default 600)")
    args = parser.parse_args(argv)
    with RabbitCluster(args.size) as cluster:
        print(cluster.url(), flush=True)
        print("nodes:", ", ".join(cluster.running_nodes()), flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.hold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
