"""Engines run a :class:`StatePlan` on Spark; pick one with the operators' ``engine=`` argument."""

from .base import ENGINES, Engine, StatePlan, get_engine, register_engine
from .batched import BatchedEngine
from .tws import TransformWithStateEngine

register_engine("tws", TransformWithStateEngine)
register_engine("batched", BatchedEngine)

#: What the built-in pipelines run on: the fastest engine that keeps their semantics.
DEFAULT_ENGINE = "batched"

__all__ = [
    "DEFAULT_ENGINE", "ENGINES", "Engine", "StatePlan", "get_engine", "register_engine", "BatchedEngine", "TransformWithStateEngine",
]
