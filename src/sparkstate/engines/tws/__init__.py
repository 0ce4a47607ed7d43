"""The tws engine: one ``transformWithState`` call per key (``engine.py``), its StatefulProcessor
(``processor.py``), and how it stores a key's state and reads it back (``layout.py``)."""

from .engine import TransformWithStateEngine

__all__ = ["TransformWithStateEngine"]
