"""The batched engine: one ``transformWithStateInPandas`` call per hash bucket (``engine.py``),
its StatefulProcessor (``processor.py``), how it stores state and reads it back (``layout.py``),
and its input's pandas path (``pandas_values.py``)."""

from .engine import BatchedEngine

__all__ = ["BatchedEngine"]
