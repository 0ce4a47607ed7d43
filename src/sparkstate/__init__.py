"""sparkstate: stateful stream processing for PySpark.

Keyed state across micro-batches with per-key timeouts (processing and event time), initial
state, and state that survives restarts and schema changes, on PySpark's transformWithState
and the RocksDB state store. The public names are those of ``docs/api.md`` (the API reference).
"""

from importlib import metadata as _metadata

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
from .state_batch import StateBatch, StateUpdate
from .vectorized import map_batches_with_state
from .engines import BatchedEngine, InBandEngine, TransformWithStateEngine
from .group_state import GroupState, GroupStateTimeout, State
from .operators import flat_map_groups_with_state, map_groups_with_state, map_with_state, update_state_by_key
from .spark import spark_session
from .spec import StateSpec

try:  # the one version string is pyproject.toml's, read from the installed package's metadata
    __version__ = _metadata.version("sparkstate")
except _metadata.PackageNotFoundError:  # sources on the path without an install
    __version__ = "0+unknown"

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
