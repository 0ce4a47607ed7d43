"""Engines run a :class:`StatePlan` on Spark; pick one with the operators' ``engine=`` argument.

Each engine is a subpackage (``tws/``, ``batched/``, ``inband/``) owning its storage layout, behind the seam
of :mod:`.base`; :func:`sparkstate.compile.choose_engine` picks one when the caller does not.
"""

from __future__ import annotations

from .base import ENGINES, Engine, StatePlan, get_engine, register_engine
from .batched import BatchedEngine
from .inband import InBandEngine
from .runtime import TRANSFORM_WITH_STATE_IN_PANDAS, pyspark_minor
from .tws import TransformWithStateEngine

register_engine("tws", TransformWithStateEngine)
register_engine("batched", BatchedEngine)
register_engine("inband", InBandEngine)

#: The engine of the operators and the pipelines when none is given: the fastest that keeps the
#: operators' semantics. ``state_ttl`` needs Spark's per-key TTL, which only ``"tws"`` has:
#: :func:`sparkstate.compile.choose_engine` picks ``"tws"`` for it.
DEFAULT_ENGINE = "batched"
#: The engine that keeps Spark's per-key state TTL (``state_ttl=``).
TTL_ENGINE = "tws"
#: The engine where Spark has no transformWithState (PySpark 3.5): applyInPandasWithState.
NO_TWS_ENGINE = "inband"


def default_engine(minor: tuple[int, int] | None = None) -> str:
    """The engine of a query that names none, on PySpark ``minor`` (default: the installed one):
    :data:`DEFAULT_ENGINE` where Spark has ``transformWithStateInPandas``, else
    :data:`NO_TWS_ENGINE`.

    >>> default_engine((4, 0)), default_engine((3, 5))
    ('batched', 'inband')
    """
    return DEFAULT_ENGINE if (minor or pyspark_minor()) >= TRANSFORM_WITH_STATE_IN_PANDAS else NO_TWS_ENGINE


__all__ = [
    "DEFAULT_ENGINE", "ENGINES", "NO_TWS_ENGINE", "default_engine", "Engine", "StatePlan", "TTL_ENGINE", "get_engine", "register_engine",
    "BatchedEngine", "InBandEngine", "TransformWithStateEngine",
]
