"""``inbox.effect``: a call outside the database (an SMS, a payment) made once per claim
across retries, recorded in the effect ledger (docs/effects.md).

The ledger's state machine is written once (``_ledger``, on a blocking connection), and so
are an effect call's decisions around it (``_steps``: a generator of steps); the blocking
inbox carries the steps out (``_blocking``), the async inbox awaiting, its writes through
``run_sync`` (``inbox.aio._effects``). The public names are ``inbox.EffectMode``,
``inbox.UncertainEffect`` and the ``effect()`` methods of the inboxes.
"""

__all__: list[str] = []
