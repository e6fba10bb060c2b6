"""Process plumbing shared by the cluster harnesses: free ports, bounded waits, commands
with timeouts, and ending what they started — a process group, a process tree, or (through
the watchdog) everything, when the harness itself dies first."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "ClusterError",
    "Fatal",
    "Watchdog",
    "free_ports",
    "freeze_and_kill",
    "kill_group",
    "kill_tree",
    "port_free",
    "run",
    "wait_until",
]


class ClusterError(RuntimeError):
    """A cluster node could not be started, stopped or queried."""


class Fatal(ClusterError):
    """A failure that waiting longer cannot cure (the process being waited for exited)."""


def free_ports(count: int, start: int, stop: int = 40000) -> list[int]:
    """``count`` consecutive loopback TCP ports from ``start`` on that nobody listens on.

    A block of consecutive ports keeps the layout readable (node 1, 2, 3 = base + 0, 1, 2).
    """
    for base in range(start, stop - count):
        if all(port_free(port) for port in range(base, base + count)):
            return list(range(base, base + count))
    raise ClusterError(f"no {count} free consecutive ports between {start} and {stop}")


def port_free(port: int) -> bool:
    """True when nothing listens on loopback ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def run(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
    cwd: Path | None = None,
) -> str:
    """Run ``command`` and return its stdout; raise :class:`ClusterError` with its stderr
    when it fails or outlives ``timeout`` seconds."""
    try:
        done = subprocess.run(
            list(command),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{command[0]} {command[1:3]} timed out after {timeout} s") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-3:]
        raise ClusterError(
            f"{Path(command[0]).name} {' '.join(command[1:4])} exited {done.returncode}: "
            + " | ".join(detail)
        )
    return done.stdout


def wait_until(check: Callable[[], bool], *, timeout: float, what: str, every: float = 0.5) -> None:
    """Call ``check`` until it returns true; :class:`ClusterError` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Fatal:
            raise
        except (ClusterError, OSError):
            pass  # not up yet
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not reached after {timeout} s")
        time.sleep(every)


def kill_group(process: subprocess.Popen[bytes], *, timeout: float = 30.0) -> None:
    """SIGKILL the process group ``process`` leads (it was started with a session of its
    own) and reap it."""
    # The whole group even when its leader has exited: children may outlive it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"process {process.pid} survived SIGKILL") from exc


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def freeze_and_kill(pids: Sequence[int], *, timeout: float = 30.0) -> None:
    """Crash the processes ``pids`` and every process below each at one instant: all are
    stopped (SIGSTOP), then all SIGKILLed; return once they are gone. For servers started
    by a supervisor that detaches them (Patroni's postmaster is nobody's child)."""
    frozen: list[int] = []
    pending = list(pids)
    while pending:
        pid = pending.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
            pending.extend(_children(pid))
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in frozen):
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {frozen} survived SIGKILL")
        time.sleep(0.05)


def kill_tree(process: subprocess.Popen[bytes], *, timeout: float = 30.0) -> None:
    """Crash ``process`` and every process below it at one instant: all are stopped
    (SIGSTOP, so none sends or commits anything more), then all SIGKILLed, then reaped.

    For servers whose children leave the process group (PostgreSQL's backends call
    ``setsid``), where :func:`kill_group` would kill the parent alone and leave the rest
    running for a moment."""
    frozen: list[int] = []
    pending = [process.pid]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
            pending.extend(_children(pid))
    for pid in frozen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    kill_group(process, timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in frozen[1:]):
        if time.monotonic() > deadline:
            raise ClusterError(f"processes {frozen} survived SIGKILL")
        time.sleep(0.05)


_WATCHDOG = (
    'while kill -0 "$1" 2>/dev/null; do sleep 1; done; '
    'for g in $(cat "$2/pgids" 2>/dev/null); do kill -KILL "-$g" 2>/dev/null; done; '
    'for p in $(cat "$2/pids" 2>/dev/null); do '
    '  grep -qa "$3" "/proc/$p/environ" 2>/dev/null && kill -KILL "$p"; '
    "done; "
    'rm -rf "$2"'
)


class Watchdog:
    """Kills a cluster's servers if the process that started them dies without tearing
    them down (SIGKILL, a test timeout): a shell polling that process every second, which
    then SIGKILLs the process groups listed in ``root/pgids``, the processes listed in
    ``root/pids`` whose environment holds ``marker`` (so a reused id is never hit), and
    removes ``root``."""

    def __init__(self, root: Path, marker: str = "") -> None:
        self.root = root
        self.groups: set[int] = set()
        self.pids: set[int] = set()
        self._shell = subprocess.Popen(
            ["sh", "-c", _WATCHDOG, "cluster-watchdog", str(os.getpid()), str(root), marker],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def watch(self, process: subprocess.Popen[bytes]) -> None:
        """Add the process group ``process`` leads."""
        self.groups.add(process.pid)
        self._write()

    def forget(self, process: subprocess.Popen[bytes]) -> None:
        """Drop a group that is gone (so a reused id is never killed)."""
        self.groups.discard(process.pid)
        self._write()

    def watch_pids(self, pids: set[int]) -> None:
        """Replace the list of single processes (checked against the marker) to kill."""
        if pids != self.pids:
            self.pids = set(pids)
            (self.root / "pids").write_text("".join(f"{p}\n" for p in sorted(self.pids)))

    def close(self) -> None:
        """Stop watching (the caller has torn everything down itself)."""
        self._shell.kill()
        self._shell.wait(10)

    def _write(self) -> None:
        (self.root / "pgids").write_text("".join(f"{g}\n" for g in sorted(self.groups)))
