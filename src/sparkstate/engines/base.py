"""The engine seam: what an operator hands an engine, and what it gets back.

An operator compiles the user's function and types into a :class:`StatePlan` (everything
here is picklable and holds no DataFrame or session); an engine turns the input DataFrame and
the plan into the output DataFrame. A new engine registers itself in :data:`ENGINES` and needs
no change to operators or pipelines.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from ..errors import ConfigError
from ..group_state import GroupFunc, GroupStateTimeout
from ..types import Codec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RESERVED_PREFIX = "_sparkstate_"
#: The tws engine's state variable (layout 2; what ``format("statestore")`` reads): one row per
#: key, of the fixed schema :data:`STATE_ROW_SCHEMA` whatever the state type, so that Spark sees
#: the same value schema under either state encoding (``unsaferow``, which allows no schema
#: change, or ``avro``) and the state's own evolution is ours (see :mod:`sparkstate.state.evolution`).
STATE_VARIABLE = "sparkstate_v2"
#: Layout 1 (earlier releases): variable ``sparkstate`` holding the state's fields as Spark
#: columns beside these two meta columns, which relied on Avro state encoding for evolution.
LEGACY_STATE_VARIABLE = "sparkstate"
EXISTS_COLUMN = "_sparkstate_exists"
TIMEOUT_COLUMN = "_sparkstate_timeout_ms"
#: Columns of a layout-2 state row: the type tag of the state's columns (``types.type_tag``), the
#: encoded state (:func:`encode_state_blob`; null when only a timeout is pending), the timeout.
SCHEMA_FIELD = "schema"
STATE_FIELD = "state"
TIMEOUT_FIELD = "timeout_ms"
STATE_ROW_SCHEMA = StructType([
    StructField(SCHEMA_FIELD, StringType(), True),
    StructField(STATE_FIELD, BinaryType(), True),
    StructField(TIMEOUT_FIELD, LongType(), True),
])
#: What a layout-2 query opens under the layout-1 name and never writes: a layout-1 checkpoint
#: holds ``_sparkstate_exists`` as a boolean there, which Spark cannot evolve to binary under
#: either encoding, so such a checkpoint is refused when the query starts instead of its state
#: being silently ignored (with ``checkpoint=``, ``state.evolution`` refuses it earlier, in words).
LEGACY_GUARD_SCHEMA = StructType([StructField(EXISTS_COLUMN, BinaryType(), True)])
#: Pickle protocol of encoded state (both engines): the state's column values as a tuple of
#: builtins (nested structs as Rows), field order given by the type tag stored beside them.
PICKLE_PROTOCOL = 5
#: Column of an initial-state DataFrame (and of ``ss.state.read``) holding a pending timeout.
INITIAL_TIMEOUT_COLUMN = "timeout_ms"

@dataclass(frozen=True)
class StatePlan:
    """A keyed stateful computation, ready for an engine.

    ``func`` is called as ``func(key, values, state)`` once per key and micro-batch (and once
    per timeout); its result is one output or ``None`` (``flat=False``), or an iterable of
    outputs (``flat=True``). Outputs go through ``output_encoder`` into ``output_schema``.
    """

    operator: str
    key_columns: tuple[str, ...]
    func: GroupFunc
    flat: bool
    state_codec: Codec
    output_schema: "StructType"
    output_encoder: Callable[[Any], Any]
    timeout: GroupStateTimeout
    keep_expired_state: bool
    state_ttl_ms: int | None
    value_decoder: Callable[[Any], Any] | None
    output_mode: str
    has_watermark: bool
    streaming: bool
    initial_has_timeout: bool = False
    #: Keys loaded from the initial state without a ``timeout_ms`` time out this long after the
    #: first batch (``map_with_state`` with ``StateSpec.timeout``: they are idle from the start).
    initial_idle_timeout_ms: int | None = None
    #: An output column (timestamp) carrying event time onward: Spark then gives the operator's
    #: output a watermark, so a streaming aggregation, deduplication or join may follow it.
    event_time_column: str | None = None

    def __reduce__(self) -> tuple:
        # On its way to a worker the plan is one blob unpickled by sparkstate's own code, so a
        # module the worker cannot import (the user's function's, or its types') becomes one
        # readable error naming it (sparkstate.shipping.load_plan), not a bare ModuleNotFoundError.
        from ..shipping import dump_plan

        what = f"the state function {getattr(self.func, '__name__', self.func)!r} of {self.operator}"
        return _plan_from, (dump_plan(tuple(getattr(self, f.name) for f in fields(self))), what)


def _plan_from(blob: bytes, what: str) -> StatePlan:
    from ..shipping import load_plan

    return StatePlan(*load_plan(blob, what))


class Engine(abc.ABC):
    """Runs a :class:`StatePlan` on a DataFrame."""

    name: str = ""

    @abc.abstractmethod
    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        """Return the output DataFrame of ``plan`` applied to ``df``.

        ``initial_state``, when given, has the key columns (typed as in ``df``, named
        :func:`initial_key_column`), then the
        state's columns (``plan.state_codec.columns``), then ``timeout_ms`` when
        ``plan.initial_has_timeout``.
        """


def initial_key_column(i: int) -> str:
    """Name of the i-th key column in the initial-state layout handed to engines."""
    return f"{RESERVED_PREFIX}key_{i}"


ENGINES: dict[str, Callable[[], Engine]] = {}


def register_engine(name: str, factory: Callable[[], Engine]) -> None:
    ENGINES[name] = factory


def get_engine(name: str | Engine) -> Engine:
    if isinstance(name, Engine):
        return name
    if name not in ENGINES:
        raise ConfigError(f"engine: expected one of {', '.join(sorted(ENGINES))}, got {name!r}")
    return ENGINES[name]()


#: The column metadata key by which Spark finds the event-time watermark of a plan.
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


def has_watermark(df: "DataFrame") -> bool:
    """Whether a column of ``df`` carries an event-time watermark (``withWatermark`` upstream):
    then Spark drops the rows behind it inside the stateful operator reading ``df``."""
    return any(WATERMARK_DELAY_KEY in (f.metadata or {}) for f in df.schema.fields)
