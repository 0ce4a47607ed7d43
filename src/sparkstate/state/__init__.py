"""Offline state tools: read, export, inspect and check the state of a sparkstate query.

``read`` and ``export`` give each key's state decoded back to its own fields, with its pending
timeout; an export is accepted unchanged as ``initial_state`` of a new query (new source, new
partition count, new code). ``check_compatible`` compares a checkpoint's state with new code.
Every checkpoint is read through the engine that wrote it (:mod:`sparkstate.engines.base`).
"""

from ..engines.evolution import FieldChange, check_compatible, diff_schemas
from .read import check_local, engine_of, export, keys, read, stats, stored_schema, stored_schemas

__all__ = ["FieldChange", "check_compatible", "check_local", "diff_schemas", "engine_of", "export", "keys", "read", "stats", "stored_schema", "stored_schemas"]
