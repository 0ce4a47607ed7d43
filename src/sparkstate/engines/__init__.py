"""Engines run a :class:`StatePlan` on Spark; pick one with the operators' ``engine=`` argument.

Each engine is a subpackage (``tws/``, ``batched/``) owning its storage layout, behind the seam
of :mod:`.base`; :func:`sparkstate.compile.choose_engine` picks one when the caller does not.
"""

from __future__ import annotations

from .base import ENGINES, Engine, StatePlan, get_engine, register_engine
from .batched import BatchedEngine
from .tws import TransformWithStateEngine

register_engine("tws", TransformWithStateEngine)
register_engine("batched", BatchedEngine)

#: The engine of the operators and the pipelines when none is given: the fastest that keeps the
#: operators' semantics. ``state_ttl`` needs Spark's per-key TTL, which only ``"tws"`` has:
#: :func:`sparkstate.compile.choose_engine` picks ``"tws"`` for it.
DEFAULT_ENGINE = "batched"
#: The engine that keeps Spark's per-key state TTL (``state_ttl=``).
TTL_ENGINE = "tws"


__all__ = [
    "DEFAULT_ENGINE", "ENGINES", "Engine", "StatePlan", "TTL_ENGINE", "get_engine", "register_engine",
    "BatchedEngine", "TransformWithStateEngine",
]
