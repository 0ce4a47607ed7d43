"""Engines run a :class:`StatePlan` on Spark; pick one with the operators' ``engine=`` argument.

Each engine is a subpackage (``tws/``, ``batched/``) owning its storage layout, behind the seam
of :mod:`.base`; :func:`engine_for` picks one when the caller does not.
"""

from __future__ import annotations

from .base import ENGINES, Engine, StatePlan, get_engine, register_engine
from .batched import BatchedEngine
from .tws import TransformWithStateEngine

register_engine("tws", TransformWithStateEngine)
register_engine("batched", BatchedEngine)

#: The engine of the operators and the pipelines when none is given: the fastest that keeps the
#: operators' semantics. ``state_ttl`` needs Spark's per-key TTL, which only ``"tws"`` has:
#: :func:`engine_for` picks ``"tws"`` for it.
DEFAULT_ENGINE = "batched"
#: The engine that keeps Spark's per-key state TTL (``state_ttl=``).
TTL_ENGINE = "tws"


def engine_for(engine: str | Engine | None, *, state_ttl: bool = False) -> str | Engine:
    """``engine`` when given; else :data:`DEFAULT_ENGINE`, or :data:`TTL_ENGINE` with ``state_ttl``."""
    if engine is not None:
        return engine
    return TTL_ENGINE if state_ttl else DEFAULT_ENGINE


__all__ = [
    "DEFAULT_ENGINE", "ENGINES", "Engine", "StatePlan", "TTL_ENGINE", "engine_for", "get_engine", "register_engine",
    "BatchedEngine", "TransformWithStateEngine",
]
