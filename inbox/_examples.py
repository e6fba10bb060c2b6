"""``python -m inbox.demo`` and ``python -m inbox.demo_sms``: the demos live in the
repository's ``examples/``, beside the other runnable examples; these entries run them from a
checkout (where ``python -m`` finds this package first)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

__all__ = ["run_example"]

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str) -> int:
    """Run ``examples/<name>`` as a script, with this process's arguments; 2 (and one line
    saying where the demo lives) when this installation has no ``examples/``."""
    path = EXAMPLES / name
    if not path.is_file():
        sys.stderr.write(
            f"the demo is examples/{name} in the repository: run this from a checkout "
            f"(git clone, pip install ., python -m inbox.{path.stem}), or run the file "
            "itself with this installation's python\n"
        )
        return 2
    sys.argv[0] = str(path)
    runpy.run_path(str(path), run_name="__main__")
    return 0
