"""sparkstate: stateful stream processing for PySpark.

Keyed state across micro-batches with per-key timeouts (processing and event time), initial
state, and state that survives restarts and schema changes, on PySpark's transformWithState
and the RocksDB state store. The public names are those of ``docs/api.md`` (the API reference).
"""

from . import pipelines, state, testing
from .errors import (
    ConfigError,
    SparkStateError,
    StateNotFoundError,
    StateSchemaError,
    StateTypeError,
    TimeoutConfigError,
    UserFunctionError,
    WorkerImportError,
)
from .batch_state import StateBatch, StateUpdate
from .batches import map_batches_with_state
from .engines import BatchedEngine, InBandEngine, TransformWithStateEngine
from .group_state import GroupState, GroupStateTimeout, State
from .operators import flat_map_groups_with_state, map_groups_with_state, map_with_state, update_state_by_key
from .session import spark_session
from .spec import StateSpec

__version__ = "0.1.0"

__all__ = [
    "BatchedEngine",
    "InBandEngine",
    "ConfigError",
    "GroupState",
    "GroupStateTimeout",
    "SparkStateError",
    "State",
    "StateNotFoundError",
    "StateSchemaError",
    "StateBatch",
    "StateSpec",
    "StateTypeError",
    "StateUpdate",
    "TimeoutConfigError",
    "TransformWithStateEngine",
    "UserFunctionError",
    "WorkerImportError",
    "flat_map_groups_with_state",
    "map_batches_with_state",
    "map_groups_with_state",
    "map_with_state",
    "pipelines",
    "spark_session",
    "state",
    "testing",
    "update_state_by_key",
]
