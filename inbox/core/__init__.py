"""The inbox itself: a message routed to the handlers that take it, each run exactly once in
one database transaction with its claim.

``Inbox`` is the public name (also ``inbox.Inbox``). The modules, in the order a message
meets them: ``_registration`` and ``_handlers`` (the decorator, the routing table),
``_routing`` (handlers and claim keys, no I/O), ``_settlement`` (outcomes into a result, the
retries), ``_transaction`` (begin and claim, run, check and commit), ``_backends`` (what each
database and driver does for those steps), ``_guards`` and ``_misuse`` (handlers that end the
transaction themselves), ``_sessions`` (sessions the inbox cannot own), ``_batch`` (many
messages in one transaction). docs/architecture.md draws the whole path.
"""

from inbox.core._inbox import Inbox

__all__ = ["Inbox"]
