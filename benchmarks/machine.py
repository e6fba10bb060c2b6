"""The machine and the versions a benchmark run measured: CPU, cores, RAM, load, Python,
packages, and the servers (PostgreSQL with the settings that set its commit cost, MariaDB,
RabbitMQ, pgbench). What cannot be reached is recorded as such, never guessed.

    .venv/bin/python benchmarks/machine.py        # prints the JSON
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import DEFAULT_BROKER, DEFAULT_DATABASE, DEFAULT_MARIADB, installed
from sqlalchemy import create_engine, text

PACKAGES = (
    "inbox",
    "SQLAlchemy",
    "psycopg",
    "psycopg-binary",
    "PyMySQL",
    "asyncpg",
    "aiosqlite",
    "asyncmy",
    "kombu",
    "amqp",
    "faststream",
    "aio-pika",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "pydantic",
    "matplotlib",
)
POSTGRES_SETTINGS = ("synchronous_commit", "fsync", "shared_buffers", "wal_sync_method")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's processor string."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def memory_gib() -> float | None:
    """Total RAM in GiB (from /proc/meminfo), None where unknown."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
    return None


def postgres(url: str) -> dict[str, Any]:
    """PostgreSQL's version and the settings that decide what a commit costs."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            found: dict[str, Any] = {
                "version": connection.execute(text("SHOW server_version")).scalar_one()
            }
            for name in POSTGRES_SETTINGS:
                found[name] = connection.execute(text(f"SHOW {name}")).scalar_one()
            return found
    except Exception as exc:  # recorded, not fatal: the page says it was not reachable
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    finally:
        engine.dispose()


def mariadb(url: str) -> dict[str, Any]:
    """MariaDB's version."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return {"version": connection.execute(text("SELECT VERSION()")).scalar_one()}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    finally:
        engine.dispose()


def rabbitmq(url: str) -> dict[str, Any]:
    """RabbitMQ's version, from the connection's server properties."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
            properties = connection.connection.server_properties
            version = properties.get("version", b"")
            product = properties.get("product", b"")
            decode = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
            return {"product": decode(product), "version": decode(version)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}


def pgbench() -> str | None:
    """``pgbench --version``, or None when it is not installed."""
    binary = shutil.which("pgbench")
    if binary is None:
        return None
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def machine_info(
    database: str = DEFAULT_DATABASE, maria: str = DEFAULT_MARIADB, broker: str = DEFAULT_BROKER
) -> dict[str, Any]:
    """Everything above as one JSON-ready dict."""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": memory_gib(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "packages": {name: installed(name) for name in PACKAGES},
        "postgresql": postgres(database),
        "mariadb": mariadb(maria),
        "rabbitmq": rabbitmq(broker),
        "pgbench": pgbench(),
    }


if __name__ == "__main__":
    json.dump(machine_info(), sys.stdout, indent=2)
    print()
