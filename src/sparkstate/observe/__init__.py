"""Watching running jobs: per-batch metrics (a JSON-lines file) and a live progress display.

>>> from sparkstate.observe import MetricsListener, ProgressDisplay, batch_metrics
>>> batch_metrics({"batchId": 2, "numInputRows": 9}, "output").rows_in
9
"""

from .listener import MetricsListener
from .metrics import DEAD_LETTER_OBSERVATION, OUTPUT_OBSERVATION, BatchMetrics, RunTotals, batch_metrics, redact
from .progress import ProgressDisplay, human_bytes

__all__ = [
    "BatchMetrics",
    "DEAD_LETTER_OBSERVATION",
    "MetricsListener",
    "OUTPUT_OBSERVATION",
    "ProgressDisplay",
    "RunTotals",
    "batch_metrics",
    "human_bytes",
    "redact",
]
