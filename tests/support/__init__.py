"""Shared test support: what several test files need, in modules by job.

Import the module you need (``from support.databases import Database``); this package
imports nothing itself, so a worker subprocess that needs only :mod:`support.effects` does not
load pytest or kombu.

* :mod:`support.databases` — server URLs, the backends, the effects table, :class:`Database`,
  :func:`fresh_database`, and :func:`cannot_run` (skip locally, fail under ``CI=true``).
* :mod:`support.rabbit` — :class:`Rabbit`, a RabbitMQ area of per-test queues.
* :mod:`support.redis` — :class:`RedisArea`, a Redis area of per-test streams.
* :mod:`support.effects` — the effect-writing handlers and message builders.
* :mod:`support.strategies` — the hypothesis strategies for hostile input.
"""
