"""``python -m inbox.demo_sms``: the SMS demo of ``examples/demo_sms.py`` (``inbox.effect``
through failures, redeliveries and crashed processes; ``--help`` for the rest)."""

import sys

from inbox._examples import run_example

if __name__ == "__main__":
    sys.exit(run_example("demo_sms.py"))
