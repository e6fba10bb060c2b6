"""Where the time goes: a pyinstrument profile summed by layer (the async benchmarks' summary).

Each frame's own time is charged to the first layer whose package its file belongs to, so
the table says how much of a run was the driver, SQLAlchemy, the inbox, the broker client
or the event loop waiting for I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("waiting (poll, socket, driver wait)", ("selectors.py", "socket.py", "ssl.py")),
    ("database driver", ("/asyncpg/", "/psycopg/", "/psycopg_binary/", "/psycopg_pool/")),
    ("SQLAlchemy", ("/sqlalchemy/",)),
    ("inbox", ("/inbox/",)),
    ("FastStream + aio-pika", ("/faststream/", "/aio_pika/", "/aiormq/", "/pamqp/", "/anyio/")),
    ("FastDepends + pydantic", ("/fast_depends/", "/pydantic")),
    ("kombu + py-amqp", ("/kombu/", "/amqp/", "/vine/")),
    ("asyncio machinery", ("/asyncio/",)),
    ("greenlet", ("greenlet",)),
)
OTHER = "other (benchmark code, stdlib, uuid, logging)"


# C calls that wait for the database or the broker (psycopg's wait_c is libpq's poll loop).
_IO_CALLS = ("poll", "select", "send", "recv", "sendall", "recv_into", "read", "write", "wait_c")


def _frames(frame: Any, parent: str) -> Iterator[tuple[Any, str]]:
    """Every real frame with its layer; a built-in (C) call is charged to the layer that
    called it, except socket and poll calls, which are I/O."""
    layer = layer_of(frame.file_path, frame.function, parent)
    yield frame, layer
    for child in frame.children:
        if not child.is_synthetic:  # its time is in its parent's own time
            yield from _frames(child, layer)


def layer_of(file_path: str | None, function: str | None, parent: str = OTHER) -> str:
    """The layer a frame belongs to."""
    path = file_path or ""
    if path == "<built-in>":
        name = (function or "").rsplit(".", 1)[-1]
        if name in _IO_CALLS:
            return LAYERS[0][0]
        return "greenlet" if "greenlet" in (function or "").lower() else parent
    if function == "wait" and "/psycopg/" in path:
        return LAYERS[0][0]  # psycopg's C wait loop has no frame of its own: this is libpq waiting
    for name, markers in LAYERS:
        if any(marker in path for marker in markers):
            return name
    return OTHER


def summary(profiler: Any) -> dict[str, float]:
    """Seconds of own time per layer in ``profiler``'s last session, largest first."""
    root = profiler.last_session.root_frame()
    totals: dict[str, float] = {}
    if root is None:
        return totals
    for frame, layer in _frames(root, OTHER):
        totals[layer] = totals.get(layer, 0.0) + frame.total_self_time
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def print_summary(title: str, totals: dict[str, float]) -> None:
    """One table: layer, seconds, share."""
    whole = sum(totals.values()) or 1.0
    print(f"  where the time goes: {title}")
    for layer, seconds in totals.items():
        print(f"    {layer:<42} {seconds:7.2f} s  {seconds / whole:6.1%}")


@contextmanager
def profiled(
    enabled: bool, out: Path, title: str, on_done: Callable[[dict[str, float]], None]
) -> Iterator[None]:
    """Profile the block with pyinstrument when ``enabled`` (and installed); save the text
    profile to ``out``, print the per-layer summary and hand it to ``on_done``."""
    if not enabled:
        yield
        return
    try:
        from pyinstrument import Profiler
    except ImportError:
        print("  (pyinstrument not installed: no profile; pip install -e '.[bench]')")
        yield
        return
    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
    totals = summary(profiler)
    print_summary(title, totals)
    print(f"  profile: {out}")
    on_done(totals)
