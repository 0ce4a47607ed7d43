"""The inband engine: one ``applyInPandasWithState`` call per hash bucket (``engine.py``), each
bucket's state one row of Spark's own state store shipped with the rows (``layout.py``), the
batched engine's per-key loop over it (``processor.py``). The engine of PySpark 3.5, which has
no ``transformWithState``; ``engine="inband"`` on every minor."""

from .engine import InBandEngine

__all__ = ["InBandEngine"]
