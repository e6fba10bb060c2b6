"""Transitional: the shared handlers moved to :mod:`support.effects`. This module re-exports
them until every importer uses ``support.effects``, then it goes."""

from support.effects import Recorder, order, record_effect

__all__ = ["Recorder", "order", "record_effect"]
