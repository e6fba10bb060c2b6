"""``python -m inbox.demo``: the demo of ``examples/demo.py`` (a publisher, a worker and
handlers on SQLite and kombu's in-memory broker by default; ``--help`` for the rest)."""

import sys

from inbox._examples import run_example

__all__: list[str] = []  # run as a program: no names to import

if __name__ == "__main__":
    sys.exit(run_example("demo.py"))
