"""Engines that run keyed state on Spark. See :mod:`sparkstate.engines.base` for the seam."""

from .base import ENGINES, Engine, StatePlan, get_engine, register_engine
from .tws import TransformWithStateEngine

register_engine("tws", TransformWithStateEngine)

__all__ = ["ENGINES", "Engine", "StatePlan", "get_engine", "register_engine", "TransformWithStateEngine"]
