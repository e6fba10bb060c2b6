"""``python -m inbox.demo_sms``: the SMS demo of ``examples/demo_sms.py`` (``inbox.effect``
through failures, redeliveries and crashed processes; ``--help`` for the rest)."""

import sys

from inbox._examples import run_example

__all__: list[str] = []  # run as a program: no names to import

if __name__ == "__main__":
    sys.exit(run_example("demo_sms.py"))
