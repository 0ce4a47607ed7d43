"""The engine seam: what an operator hands an engine, and what it gets back.

An operator compiles the user's function and types into a :class:`StatePlan` (everything
here is picklable and holds no DataFrame or session); an engine turns the input DataFrame and
the plan into the output DataFrame (:meth:`Engine.apply`). The offline state tools
(:mod:`sparkstate.state`) and the ``checkpoint=`` check ask each registered engine whether it
wrote a checkpoint's state (:meth:`Engine.stored_layout`) and read that state back through the
:class:`StoredLayout` it returns, in one neutral shape (:func:`records_schema`). Each engine is a
subpackage owning its layout (``layout.py``: how state is stored and read back) and its
Spark-side processor (``processor.py``). A new engine registers itself in :data:`ENGINES` and
needs no change to operators, pipelines or the state tools.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable

from pyspark.sql.types import BooleanType, IntegerType, LongType, StructField, StructType

from ..errors import ConfigError
from ..group_state import GroupFunc, GroupStateTimeout
from ..types import Codec
from . import driver_state
from .runtime import STATE_READERS, has

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RESERVED_PREFIX = "_sparkstate_"
#: Pickle protocol of encoded state (both engines): the state's column values as a tuple of
#: builtins (nested structs as Rows), field order given by the field names stored beside them.
PICKLE_PROTOCOL = 5
#: Column of an initial-state DataFrame (and of ``ss.state.read``) holding a pending timeout.
INITIAL_TIMEOUT_COLUMN = "timeout_ms"
#: Column of :meth:`StoredLayout.records`: whether the key has state (not only a pending timeout).
EXISTS_COLUMN = "_sparkstate_exists"


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
    #: The same computation over many keys at once (:class:`BucketLogic`), for an engine that
    #: groups keys into buckets; an engine that calls one key at a time runs ``func``.
    bucket_logic: "BucketLogic | None" = None
    #: Call ``func`` for every stored key in each micro-batch that has input, with no values for a
    #: key without new rows (DStream ``updateStateByKey``); set only for an engine whose
    #: :meth:`Engine.visits_every_key` says it can, and then without timeouts, so a micro-batch
    #: without input calls nothing and ``trigger(availableNow=True)`` ends.
    every_key: bool = False

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


@dataclass(frozen=True)
class BucketCall:
    """What an engine hands a :class:`BucketLogic`: one call for a group of keys (a bucket) in
    one micro-batch. Everything is columns; the engine has already read the keys' stored state.

    ``keys``: the call's keys as a group function sees its key (a scalar for one key column, a
    tuple for several): first the ``n_input`` keys with new rows, in the order their first row
    arrived, then the keys without rows whose timeout is due, as
    :func:`~sparkstate.engines.rules.due_keys` orders them. ``rows``: the new rows, a
    ``pyarrow.Table`` with the operator input's columns in Spark's Arrow types (timestamps as UTC
    instants), in arrival order; ``key_index``: for each row, its key's position in ``keys`` (a
    numpy int64 array). ``states``: for each key, its stored state as the codec's columns
    (:meth:`~sparkstate.types.Codec.encode_columns`), or ``None``; ``timeouts``: each key's pending
    timeout (epoch ms) or ``None``. ``watermark_ms``: the micro-batch's watermark as
    ``GroupState.getCurrentWatermarkMs`` gives it (-1 when the input has none);
    ``processing_time_ms``: its processing time.
    """

    keys: list
    rows: Any
    key_index: Any
    states: list
    timeouts: list
    n_input: int
    watermark_ms: int
    processing_time_ms: int


@dataclass(frozen=True)
class BucketResult:
    """What a :class:`BucketLogic` returns for a :class:`BucketCall`.

    ``writes``: key -> ``(state columns, timeout_ms)`` (the new stored state, as the codec's
    columns or ``None`` for a timeout alone, and the key's pending timeout or ``None``), or
    ``None`` to remove the key's state and timeout. A key of the call left out keeps its state and
    timeout; only keys of the call may be written. The engine owns the storage and the timers: it
    fires a timeout once the clock (the watermark in event time, else the processing time) is
    strictly past it, by calling again with the key among the due keys.
    ``frames``: output rows as pandas DataFrames with the output schema's columns in Spark's
    pandas types, yielded as they are. ``rows``: output rows as a group function returns them
    (tuples of ``output_type``), encoded by the engine, with ``row_keys`` the key of each
    (named in an error about it).
    """

    writes: dict
    frames: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    row_keys: list = field(default_factory=list)


class BucketLogic(abc.ABC):
    """Keyed-state logic over a bucket of keys at a time: the extension point a pipeline uses
    to run as column operations where an engine groups keys (``StatePlan.bucket_logic``).

    It must compute what ``StatePlan.func`` computes key by key (same outputs, same stored state
    and timeouts), so a checkpoint written either way goes on the other way: an engine that
    calls one key at a time runs ``func``, an engine that groups keys calls :meth:`run` once per
    group and micro-batch (and once for a group whose earliest timeout is due, with no rows).
    It is pickled to the workers with the plan; it holds settings only, never storage.
    """

    @abc.abstractmethod
    def run(self, call: BucketCall) -> BucketResult:
        """The outputs and the state writes of one call (see :class:`BucketCall`, :class:`BucketResult`)."""


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

    def visits_every_key(self, df: "DataFrame") -> bool:
        """Whether this engine runs a plan with ``every_key`` on ``df``: every stored key called in
        each micro-batch with input. An engine that cannot leaves it to the operator (the
        ``update_state_by_key`` adapter then revisits its keys through a 1 ms processing-time timeout)."""
        return False

    def for_checkpoint(self, spark: "SparkSession", stored: "StoredLayout | None", checkpoint: str) -> "Engine":
        """This engine set up for the state in ``checkpoint`` (``stored``: that state, which this
        engine wrote; ``None`` when the checkpoint has none yet). Called before the plan is built,
        so a layout setting fixed at a checkpoint's creation (the batched engine's bucket count) is
        known on restart; raises :class:`ConfigError` when the caller asked for another one."""
        return self

    def stored_layout(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> "StoredLayout | None":
        """This engine's reader of a stateful operator's state in ``checkpoint``, or ``None`` when
        the engine did not write it (another engine's, or not a sparkstate operator).

        ``operator``: one row of the checkpoint's ``state-metadata`` (see
        :func:`sparkstate.engines.checkpoint.operators`), ``state_variables`` naming its variables.
        """
        return None


def struct_column(schema: StructType, name: str) -> StructType:
    """The struct type of column ``name`` of ``schema`` (a stored record's ``key`` or ``value``)."""
    t = schema[name].dataType
    if not isinstance(t, StructType):
        raise TypeError(f"column {name!r} is a {t.simpleString()}, not a struct")
    return t


class StoredLayout(abc.ABC):
    """One engine's state in a checkpoint, read back without running the query: what
    ``ss.state.read/keys/export/stats/stored_schema`` and the ``checkpoint=`` check ask of the
    engine that wrote it."""

    #: The engine's registered name, and the version of its layout this checkpoint holds.
    engine: str = ""
    version: int = 0

    def __init__(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> None:
        self.spark = spark
        self.checkpoint = checkpoint
        self.operator = operator
        self._driver_rows: dict[int, "DataFrame"] = {}

    @abc.abstractmethod
    def records(self, batch_id: int | None) -> "DataFrame":
        """One row per stored key as of the latest (or ``batch_id``) committed batch, of
        :func:`records_schema`: the key's columns, the state's fields fitted to :meth:`schema`'s
        state type, its pending timeout, whether it has state."""

    @abc.abstractmethod
    def schemas(self) -> "tuple[StructType, list[StructType]]":
        """The key schema and every state schema that stored rows were written with (more than
        one after the state type changed and not every key was written since)."""

    def schema(self) -> "tuple[StructType, StructType]":
        """The (key, state) schemas of :meth:`records` (after a state type change: the one most
        keys hold)."""
        schema = self.records(None).schema
        return struct_column(schema, "key"), struct_column(schema, "value")

    def settings(self) -> dict[str, Any]:
        """The layout settings fixed when the checkpoint was created (the batched engine:
        ``{"buckets": N}``), for :meth:`Engine.for_checkpoint` and ``state stats``."""
        return {}

    def reads(self) -> dict[str, Any]:
        """How batches read this state, for ``state stats`` (the batched engine:
        :func:`~sparkstate.engines.batched.layout.read_plan`); empty when every key is read by key."""
        return {}

    def restart_refusal(self) -> str | None:
        """Why a query of this release cannot run on this state (an older layout), with the way
        out; ``None`` when it can."""
        return None

    def state_rows(self, batch_id: int | None) -> "DataFrame":
        """The operator's state rows as of the latest (or ``batch_id``) committed batch: ``key``,
        ``value`` (structs of the operator's own state row) and ``partition_id``. Spark's
        ``statestore`` reader on PySpark 4.0 and later; on 3.5, which has none, Spark's state store
        read on the driver (:mod:`.driver_state`), once per batch for this reader's life."""
        if has(STATE_READERS):
            reader = self.spark.read.format("statestore").option("operatorId", self.operator["operator_id"])
            if batch_id is not None:
                reader = reader.option("batchId", batch_id)
            return reader.load(self.checkpoint)
        batch = self.operator["max_batch_id"] if batch_id is None else batch_id
        if batch not in self._driver_rows:
            self._driver_rows[batch] = driver_state.state_rows(self.spark, self.checkpoint, self.operator, batch)
        return self._driver_rows[batch]

    def state_row_schema(self) -> "StructType":
        """The value schema of :meth:`state_rows` (read without reading the rows where Spark allows)."""
        if has(STATE_READERS):
            return struct_column(self.state_rows(None).schema, "value")
        found = driver_state.schemas(self.spark, self.checkpoint, self.operator["operator_id"])
        return found[1] if found is not None else StructType([])

    def variable(self, name: str, batch_id: int | None) -> "DataFrame":
        """One state variable of the operator, as Spark's ``statestore`` reader gives it."""
        reader = (self.spark.read.format("statestore").option("stateVarName", name)
                  .option("operatorId", self.operator["operator_id"]))
        if batch_id is not None:
            reader = reader.option("batchId", batch_id)
        return reader.load(self.checkpoint)


def records_schema(key_schema: "StructType", state_schema: "StructType") -> "StructType":
    """The shape of :meth:`StoredLayout.records`, whatever the engine."""
    return StructType([
        StructField("partition_id", IntegerType(), True),
        StructField("key", key_schema, True),
        StructField("value", state_schema, True),
        StructField(INITIAL_TIMEOUT_COLUMN, LongType(), True),
        StructField(EXISTS_COLUMN, BooleanType(), True),
    ])


def decoded_records(rows: "DataFrame", decode: Callable[[tuple], Any], key_schema: "StructType",
                    state_schema: "StructType") -> "DataFrame":
    """The :func:`records_schema` rows that ``decode`` makes of each row of ``rows`` (a tuple of
    its flat, top-level columns; ``decode`` yields record tuples), decoded on the workers.

    Built on ``mapInArrow``, which a classic and a Spark Connect session both run (an RDD
    would need the JVM in this process).
    """
    schema = records_schema(key_schema, state_schema)

    def run(batches: Any) -> Any:
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        # timestamps as UTC instants (Arrow stores epoch microseconds whatever the zone)
        try:
            arrow_schema = to_arrow_schema(schema, timezone="UTC")
        except TypeError:  # PySpark 4.1: no timezone= (its timestamps are always UTC)
            arrow_schema = to_arrow_schema(schema)
        for batch in batches:
            out = [rec for row in zip(*(c.to_pylist() for c in batch.columns)) for rec in decode(row)]
            if out:
                yield pa.RecordBatch.from_arrays(
                    [pa.array(col, type=f.type) for col, f in zip(zip(*out), arrow_schema)], schema=arrow_schema)

    return rows.mapInArrow(run, schema)


def initial_key_column(i: int) -> str:
    """Name of the i-th key column in the initial-state layout handed to engines."""
    return f"{RESERVED_PREFIX}key_{i}"


ENGINES: dict[str, Callable[[], Engine]] = {}


def register_engine(name: str, factory: Callable[[], Engine]) -> None:
    ENGINES[name] = factory


def get_engine(name: str | Engine) -> Engine:
    """The engine registered under ``name`` (an :class:`Engine` passes through)."""
    if isinstance(name, Engine):
        return name
    if name not in ENGINES:
        raise ConfigError(f"engine: expected one of {', '.join(sorted(ENGINES))}, got {name!r}")
    return ENGINES[name]()


#: The column metadata key by which Spark finds the event-time watermark of a plan.
WATERMARK_DELAY_KEY = "spark.watermarkDelayMs"


#: A column carrying the input's watermark that is always null: a stateful operator whose input
#: carries the watermark only in such a column runs in event time and drops no row as late
#: (``sessionize(late="emit")`` decides lateness itself and outputs the late rows).
NULL_WATERMARK_COLUMN = "_sparkstate_watermark"


def drops_late_rows(df: "DataFrame") -> bool:
    """Whether Spark drops late rows of ``df`` inside the stateful operator reading it: a column
    other than :data:`NULL_WATERMARK_COLUMN` carries the watermark."""
    return any(WATERMARK_DELAY_KEY in (f.metadata or {}) for f in df.schema.fields if f.name != NULL_WATERMARK_COLUMN)


def has_watermark(df: "DataFrame") -> bool:
    """Whether a column of ``df`` carries an event-time watermark (``withWatermark`` upstream):
    then Spark drops the rows behind it inside the stateful operator reading ``df``."""
    return any(WATERMARK_DELAY_KEY in (f.metadata or {}) for f in df.schema.fields)
