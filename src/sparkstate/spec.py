"""``StateSpec``: the DStream-style builder for :func:`sparkstate.map_with_state`.

>>> import sparkstate as ss
>>> spec = ss.StateSpec.function(lambda k, v, s: None).num_partitions(2).timeout("60 seconds")
>>> spec.partitions, spec.timeout_ms
(2, 60000)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .durations import Duration, positive_ms
from .errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class StateSpec:
    """What ``map_with_state`` needs: the function, and optionally initial state, partitions, timeout.

    Each builder method returns a new spec; the spec itself never changes.
    """

    func: Callable[[Any, Any, Any], Any]
    initial: "DataFrame | None" = None
    partitions: int | None = None
    timeout_ms: int | None = None

    @staticmethod
    def function(func: Callable[[Any, Any, Any], Any]) -> "StateSpec":
        """Start a spec from ``func(key, value | None, state) -> output | None``."""
        if not callable(func):
            raise ConfigError(f"StateSpec.function: expected a function (key, value, state) -> output, got {func!r}")
        return StateSpec(func)

    def initial_state(self, df: "DataFrame") -> "StateSpec":
        """State to start from: the key column(s) and the state's fields (primitive state: ``value``)."""
        return dataclasses.replace(self, initial=df)

    def num_partitions(self, n: int) -> "StateSpec":
        """Number of state partitions of a new checkpoint (``spark.sql.shuffle.partitions``)."""
        if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
            raise ConfigError(f"StateSpec.num_partitions: expected a positive int, got {n!r}")
        return dataclasses.replace(self, partitions=n)

    def timeout(self, duration: Duration) -> "StateSpec":
        """Keys idle (no records) for ``duration`` of processing time time out, then are removed."""
        return dataclasses.replace(self, timeout_ms=positive_ms(duration, "StateSpec.timeout"))

    # DStream spellings, for code ported from Scala.
    initialState = initial_state
    numPartitions = num_partitions
