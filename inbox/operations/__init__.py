"""The operations on an inbox that a person runs: claims found and released, effect records
settled, outbox rows retried or dropped, the status report, dead letters read, replayed and
purged, the retention guard's oldest dead letter, workers' readiness, the tables looked up,
and records rendered as plain values and text.

Internal: the ``inbox`` command (:mod:`inbox.admin`) and the console (:mod:`inbox.console`)
are its two front ends, and neither imports the other."""

__all__: list[str] = []
