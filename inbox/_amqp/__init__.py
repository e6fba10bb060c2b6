"""AMQP through kombu and py-amqp, for everything that talks to RabbitMQ: the worker
(``inbox.broker``), the relay (``inbox.outbox.relay``) and the dead-letter tooling
(``inbox.admin``). Connections (``connections``), publisher confirms tracked by tag
(``confirms``) and the frame reader that survives an undecodable delivery (``frames``).

This package owns the library's reliance on py-amqp's internals; docs/architecture.md lists
them with the tests that fail when a release changes them.
"""
