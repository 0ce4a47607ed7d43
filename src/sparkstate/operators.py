"""The keyed stateful operators: ``map_groups_with_state`` and the layers built on it.

``map_groups_with_state`` / ``flat_map_groups_with_state`` compile the user's function and
types into a :class:`~sparkstate.engines.base.StatePlan`; ``map_with_state`` and
``update_state_by_key`` are thin adapters that wrap the user's function into a group function
and reuse the same path, so timeouts and expiry exist once.

Everything is validated here, when the query is defined: unknown columns, types that cannot be
encoded, a missing watermark, bad durations, an initial state that does not fit.
"""

from __future__ import annotations

import logging
import operator
import os
from typing import Any, Callable, Iterable, Literal, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from .durations import Duration, positive_ms
from .engines import StatePlan, engine_for, get_engine
from .engines.base import INITIAL_TIMEOUT_COLUMN, RESERVED_PREFIX, Engine, has_watermark, initial_key_column
from .engines.evolution import check_checkpoint, key_struct
from .errors import ConfigError, StateTypeError, TimeoutConfigError
from .group_state import GroupState, GroupStateTimeout, State
from .session import check_session
from .shipping import ship_user_modules
from .spec import StateSpec
from .types import Codec, encoder_for, parse_schema, record_decoder

log = logging.getLogger("sparkstate")

OutputMode = Literal["update", "append"]


def _key_columns(df: DataFrame, key: Any, operator_name: str) -> tuple[str, ...]:
    if isinstance(key, str):
        keys: tuple = (key,)
    elif isinstance(key, (list, tuple)):
        keys = tuple(key)
    else:
        keys = ()
    if not keys or not all(isinstance(k, str) for k in keys):
        raise ConfigError(f"{operator_name}: key must be a column name or a list of column names, got {key!r}")
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ConfigError(
            f"{operator_name}: key column(s) {', '.join(map(repr, missing))} not in the input;"
            f" its columns are {', '.join(df.columns)}"
        )
    return keys


def _state_codec(state_type: Any, operator_name: str) -> Codec:
    if state_type is None:
        raise StateTypeError(f"{operator_name}: state_type is required (a dataclass, or int/float/str/bool/...)")
    codec = Codec.of(state_type, "state_type")
    bad = [f for f in codec.fields if f.startswith(RESERVED_PREFIX)]
    if bad:
        raise StateTypeError(
            f"{operator_name}: state field(s) {', '.join(bad)} use the reserved prefix {RESERVED_PREFIX!r}; rename them"
        )
    return codec


def _initial_state(
    initial: DataFrame | None, df: DataFrame, keys: tuple[str, ...], codec: Codec, operator_name: str
) -> tuple[DataFrame | None, bool]:
    """Select and cast an initial-state DataFrame into the engine's layout."""
    if initial is None:
        return None, False
    if not isinstance(initial, DataFrame):
        raise ConfigError(f"{operator_name}: initial_state must be a DataFrame, got {type(initial).__name__}")
    if initial.isStreaming:
        raise ConfigError(f"{operator_name}: initial_state must be a static DataFrame, not a stream")
    need = list(keys) + list(codec.fields)
    missing = [c for c in need if c not in initial.columns]
    if missing:
        what = "the key column(s) and the state's fields" if codec.is_struct else "the key column(s) and a column `value`"
        raise ConfigError(
            f"{operator_name}: initial_state must have {what}: missing {', '.join(map(repr, missing))};"
            f" it has {', '.join(initial.columns)}"
        )
    key_types = {f.name: f.dataType for f in df.schema.fields}
    # Keys get internal names: a state field may share a key column's name (UserVisit.user_id).
    cols = [F.col(k).cast(key_types[k]).alias(initial_key_column(i)) for i, k in enumerate(keys)]
    cols += [F.col(f.name).cast(f.dataType).alias(f.name) for f in codec.columns.fields]
    has_timeout = INITIAL_TIMEOUT_COLUMN in initial.columns
    if has_timeout:
        cols.append(F.col(INITIAL_TIMEOUT_COLUMN).cast("long").alias(INITIAL_TIMEOUT_COLUMN))
    return initial.select(*cols), has_timeout


def _build(
    df: DataFrame,
    *,
    operator_name: str,
    key: Any,
    func: Callable,
    state_type: Any,
    output_type: Any,
    timeout: Any,
    value_type: Any,
    initial_state: DataFrame | None,
    output_mode: str,
    keep_expired_state: bool,
    state_ttl: Duration | None,
    flat: bool,
    engine: str | Engine | None,
    value_decoder: Callable | None = None,
    initial_idle_timeout_ms: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    event_time_column: str | None = None,
) -> DataFrame:
    """Validate everything, compile a :class:`StatePlan` and hand it to the engine."""
    _check_input(df, func, operator_name)
    keys = _key_columns(df, key, operator_name)
    codec = _state_codec(state_type, operator_name)
    output_schema = parse_schema(output_type, "output_type")
    conf, mode, watermark, ttl_ms = _time_settings(df, timeout, output_mode, state_ttl, operator_name)
    if event_time_column is not None:
        _check_event_time_column(df, output_schema, event_time_column, watermark, operator_name)
    if value_decoder is None and value_type is not None:
        value_decoder = record_decoder(value_type, df.schema, "value_type")
    init_df, init_timeout = _initial_state(initial_state, df, keys, codec, operator_name)
    if checkpoint is not None:
        # without engine=, a checkpoint with state goes on with the engine that wrote it
        written_by, _ = check_checkpoint(df.sparkSession, checkpoint, key_struct(df.schema, keys), codec.columns,
                                         codec.py_type, engine=None if engine is None else get_engine(engine).name)
        engine = engine if engine is not None else written_by
    chosen = get_engine(engine_for(engine, state_ttl=ttl_ms is not None))
    plan = StatePlan(
        operator=operator_name,
        key_columns=keys,
        func=func,
        flat=flat,
        state_codec=codec,
        output_schema=output_schema,
        output_encoder=encoder_for(output_schema, "output"),
        timeout=conf,
        keep_expired_state=bool(keep_expired_state),
        state_ttl_ms=ttl_ms,
        value_decoder=value_decoder,
        output_mode=mode,
        has_watermark=watermark,
        streaming=df.isStreaming,
        initial_has_timeout=init_timeout,
        initial_idle_timeout_ms=initial_idle_timeout_ms,
        # A static input has no watermark to carry on (Spark refuses the column there).
        event_time_column=event_time_column if df.isStreaming else None,
    )
    ship_user_modules()  # the user's modules that are not installed travel with the query
    return chosen.apply(df, plan, init_df)


def _check_input(df: Any, func: Any, operator_name: str) -> None:
    if not isinstance(df, DataFrame):
        raise ConfigError(f"{operator_name}: expected a pyspark DataFrame as input, got {type(df).__name__}")
    if not callable(func):
        raise ConfigError(f"{operator_name}: func must be callable as func(key, values, state), got {func!r}")
    check_session(df.sparkSession)


def _time_settings(df: DataFrame, timeout: Any, output_mode: str, state_ttl: Duration | None,
                   operator_name: str) -> tuple[GroupStateTimeout, str, bool, int | None]:
    """(timeout kind, output mode, whether the input has a watermark, state TTL in ms), checked."""
    conf = GroupStateTimeout.parse(timeout)
    mode = str(output_mode).lower()
    if mode not in ("update", "append"):
        raise ConfigError(f"{operator_name}: output_mode must be 'update' or 'append', got {output_mode!r}")
    watermark = has_watermark(df)
    if conf is GroupStateTimeout.EventTimeTimeout and df.isStreaming and not watermark:
        raise TimeoutConfigError(
            f"{operator_name}: timeout=EventTimeTimeout needs an event-time watermark on the input, and it has none."
            " Call df.withWatermark(\"<event time column>\", \"10 seconds\") before this operator."
        )
    ttl_ms = None
    if state_ttl is not None:
        ttl_ms = positive_ms(state_ttl, f"{operator_name}: state_ttl")
        if conf is GroupStateTimeout.EventTimeTimeout:
            raise TimeoutConfigError(
                f"{operator_name}: state_ttl is measured in processing time and Spark allows it only without an"
                " event-time timeout. Drop state_ttl and let the event-time timeout expire the state, or use"
                " timeout=ProcessingTimeTimeout."
            )
    return conf, mode, watermark, ttl_ms


def _check_event_time_column(df: DataFrame, output_schema: StructType, column: str, watermark: bool,
                             operator_name: str) -> None:
    from pyspark.sql.types import TimestampType

    if not isinstance(column, str) or column not in output_schema.names:
        raise ConfigError(f"{operator_name}: event_time_column {column!r} is not an output column;"
                          f" the output has {', '.join(output_schema.names)}")
    if not isinstance(output_schema[column].dataType, TimestampType):
        raise ConfigError(f"{operator_name}: event_time_column {column!r} must be a timestamp column,"
                          f" it is {output_schema[column].dataType.simpleString()}")
    if df.isStreaming and not watermark:
        raise ConfigError(f"{operator_name}: event_time_column carries the input's event-time watermark onward,"
                          " and the input has none. Call df.withWatermark(...) before this operator.")


def map_groups_with_state(
    df: DataFrame,
    key: str | Sequence[str],
    func: Callable[[Any, Iterable[Any], GroupState], Any],
    state_type: Any,
    output_type: Any,
    timeout: GroupStateTimeout | str = GroupStateTimeout.NoTimeout,
    value_type: Any = None,
    initial_state: DataFrame | None = None,
    output_mode: OutputMode = "update",
    keep_expired_state: bool = False,
    state_ttl: Duration | None = None,
    *,
    engine: str | Engine | None = None,
    checkpoint: str | os.PathLike | None = None,
    event_time_column: str | None = None,
) -> DataFrame:
    """Keep state per key across micro-batches; ``func`` returns one output or ``None`` per call.

    ``func(key, values, state)`` is called once per key with new records in a micro-batch
    (``values``: an iterator of ``Row``, or of ``value_type``), and once per key whose timeout
    fired (``values`` empty, ``state.hasTimedOut`` true). See docs/api.md.

    ``checkpoint``: the checkpoint the query will run on. When given and it holds state, the
    stored state is checked against ``state_type`` now, and an incompatible change (a renamed
    field, a narrowed type, another key) raises :class:`StateSchemaError` with a field-by-field
    diff before anything runs.

    ``event_time_column``: a timestamp column of the output that carries event time onward
    (the input must have a watermark): Spark then gives the output a watermark, so a windowed
    aggregation or a stream-stream join in append mode may follow in the same query. Spark
    requires every output row's value there to be later than the previous micro-batch's
    watermark and fails the query otherwise (``EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED``):
    a session closed by its timeout ends before the watermark, so ``session_end`` cannot be that
    column (``sessionize(event_time_column=...)`` adds one that can). Ignored on a static input.

    ``engine``: ``"batched"`` (many keys per Python call), ``"tws"`` (one call per key, the only
    one with ``state_ttl``) or an :class:`~sparkstate.engines.Engine`. When not given: the engine
    that wrote ``checkpoint``'s state, if any; else ``sparkstate.engines.DEFAULT_ENGINE``
    (``"batched"``, the fastest; same semantics), or ``"tws"`` when ``state_ttl`` is given.
    A checkpoint keeps the engine it was started with.

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> words = spark.createDataFrame([("a",), ("b",), ("a",)], "word string")
    >>> def count(word, rows, state):
    ...     n = (state.getOption or 0) + sum(1 for _ in rows)
    ...     state.update(n)
    ...     return (word, n)
    >>> out = ss.map_groups_with_state(words, key="word", func=count, state_type=int,
    ...                                output_type="word string, n long")
    >>> sorted(out.collect())
    [Row(word='a', n=2), Row(word='b', n=1)]
    """
    return _build(
        df, operator_name="map_groups_with_state", key=key, func=func, state_type=state_type,
        output_type=output_type, timeout=timeout, value_type=value_type, initial_state=initial_state,
        output_mode=output_mode, keep_expired_state=keep_expired_state, state_ttl=state_ttl, flat=False,
        engine=engine, checkpoint=checkpoint, event_time_column=event_time_column,
    )


def flat_map_groups_with_state(
    df: DataFrame,
    key: str | Sequence[str],
    func: Callable[[Any, Iterable[Any], GroupState], Iterable[Any] | None],
    state_type: Any,
    output_type: Any,
    timeout: GroupStateTimeout | str = GroupStateTimeout.NoTimeout,
    value_type: Any = None,
    initial_state: DataFrame | None = None,
    output_mode: OutputMode = "update",
    keep_expired_state: bool = False,
    state_ttl: Duration | None = None,
    *,
    engine: str | Engine | None = None,
    checkpoint: str | os.PathLike | None = None,
    event_time_column: str | None = None,
) -> DataFrame:
    """As :func:`map_groups_with_state`, but ``func`` returns an iterable of outputs (any number).

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> df = spark.createDataFrame([("u", 1), ("u", 2)], "user string, n long")
    >>> def evens(user, rows, state):
    ...     return [(user, r.n) for r in rows if r.n % 2 == 0]
    >>> ss.flat_map_groups_with_state(df, key="user", func=evens, state_type=int,
    ...                               output_type="user string, n long").collect()
    [Row(user='u', n=2)]
    """
    return _build(
        df, operator_name="flat_map_groups_with_state", key=key, func=func, state_type=state_type,
        output_type=output_type, timeout=timeout, value_type=value_type, initial_state=initial_state,
        output_mode=output_mode, keep_expired_state=keep_expired_state, state_ttl=state_ttl, flat=True,
        engine=engine, checkpoint=checkpoint, event_time_column=event_time_column,
    )


# ---------------------------------------------------------------------------------------------
# mapWithState (DStream model): one call per record
# ---------------------------------------------------------------------------------------------

class _PerRecord:
    """Adapts a ``(key, value, State) -> output`` function to the group-function contract."""

    def __init__(self, func: Callable, timeout_ms: int | None) -> None:
        self.func = func
        self.timeout_ms = timeout_ms
        self.__name__ = getattr(func, "__name__", "map_with_state function")

    def __call__(self, key: Any, values: Iterable[Any], gstate: GroupState) -> list:
        if gstate.hasTimedOut:
            out = self.func(key, None, State(gstate, timing_out=True))
            gstate.remove()
            return [] if out is None else [out]
        st = State(gstate)
        outs = []
        for v in values:
            out = self.func(key, v, st)
            if out is not None:
                outs.append(out)
        if self.timeout_ms is not None and gstate.exists:
            gstate.setTimeoutDuration(self.timeout_ms)
        return outs


def map_with_state(
    df: DataFrame,
    key: str | Sequence[str],
    value: str | None,
    spec: StateSpec,
    state_type: Any,
    output_type: Any,
    value_type: Any = None,
    *,
    engine: str | Engine | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> DataFrame:
    """DStream ``mapWithState``: ``spec``'s function is called once per input record.

    ``func(key, value, state)``: ``value`` is the ``value`` column's value (or the whole record
    when ``value=None``); ``state`` is an :class:`~sparkstate.State`. With ``spec.timeout(d)``,
    a key idle for ``d`` gets one last call with ``value=None`` and ``state.isTimingOut()``.

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> df = spark.createDataFrame([("a", 1), ("a", 1), ("b", 1)], "word string, n long")
    >>> def track(word, n, state):
    ...     total = (state.getOption() or 0) + n
    ...     state.update(total)
    ...     return (word, total)
    >>> out = ss.map_with_state(df, key="word", value="n", spec=ss.StateSpec.function(track),
    ...                         state_type=int, output_type="word string, count long")
    >>> sorted(out.collect())
    [Row(word='a', count=1), Row(word='a', count=2), Row(word='b', count=1)]
    """
    name = "map_with_state"
    if not isinstance(spec, StateSpec):
        raise ConfigError(f"{name}: spec must be ss.StateSpec.function(func)…, got {type(spec).__name__}")
    decoder: Callable | None = None
    if value is not None:
        if value_type is not None:
            raise ConfigError(f"{name}: pass either value (a column) or value_type (whole records), not both")
        if not isinstance(value, str) or value not in df.columns:
            raise ConfigError(f"{name}: value column {value!r} not in the input; its columns are {', '.join(df.columns)}")
        decoder = operator.itemgetter(df.columns.index(value))
    if spec.partitions is not None:
        _apply_num_partitions(df, spec.partitions)
    timeout = GroupStateTimeout.ProcessingTimeTimeout if spec.timeout_ms is not None else GroupStateTimeout.NoTimeout
    return _build(
        df, operator_name=name, key=key, func=_PerRecord(spec.func, spec.timeout_ms), state_type=state_type,
        output_type=output_type, timeout=timeout, value_type=value_type, initial_state=spec.initial,
        output_mode="update", keep_expired_state=False, state_ttl=None, flat=True, engine=engine,
        value_decoder=decoder, initial_idle_timeout_ms=spec.timeout_ms, checkpoint=checkpoint,
    )


def _apply_num_partitions(df: DataFrame, n: int) -> None:
    spark = df.sparkSession
    current = spark.conf.get("spark.sql.shuffle.partitions")
    if str(current) != str(n):
        spark.conf.set("spark.sql.shuffle.partitions", str(n))
        log.warning(
            "StateSpec.num_partitions(%d): set spark.sql.shuffle.partitions=%d for this session (was %s)."
            " Spark fixes the number of state partitions when a checkpoint is created: this takes effect"
            " for a new checkpoint only; a query restarted on an existing checkpoint keeps its partitions"
            " (to change them, export the state and start a new query from it).",
            n, n, current,
        )


# ---------------------------------------------------------------------------------------------
# updateStateByKey (DStream model): every key with state, every batch
# ---------------------------------------------------------------------------------------------

class _EveryBatch:
    """Adapts ``update(new_values, state | None) -> state | None`` to the group-function contract.

    The key is revisited in every micro-batch through a 1 ms processing-time timeout, which is
    how a key without new records still gets its call (as in the DStream API).
    """

    def __init__(self, func: Callable, codec: Codec, single_key: bool, streaming: bool, keep: tuple[int, ...]) -> None:
        self.func = func
        self.codec = codec
        self.keep = keep  # state columns that are not also key columns
        self.single_key = single_key
        self.streaming = streaming
        self.__name__ = getattr(func, "__name__", "update_state_by_key function")

    def __call__(self, key: Any, values: Iterable[Any], gstate: GroupState) -> Any:
        new = self.func(list(values), gstate.getOption)
        if new is None:
            if gstate.exists:
                gstate.remove()
            return None
        gstate.update(new)
        if self.streaming:
            gstate.setTimeoutDuration(1)
        key_cols = (key,) if self.single_key else tuple(key)
        cols = self.codec.encode_columns(new)
        return key_cols + tuple(cols[i] for i in self.keep)


def update_state_by_key(
    df: DataFrame,
    key: str | Sequence[str],
    value: str | None,
    func: Callable[[list, Any], Any],
    state_type: Any,
    value_type: Any = None,
    *,
    engine: str | Engine | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> DataFrame:
    """DStream ``updateStateByKey``: ``func(new_values, state)`` for every key, every micro-batch.

    Returns the new state, or ``None`` to drop the key. Output: the key column(s), then the
    state's fields (a primitive state: one column ``value``); a state field named like a key
    column is shown once, as the key. Like the DStream API this visits
    every key with state in every batch, whatever it costs; prefer ``map_with_state``.

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> df = spark.createDataFrame([("a", 1), ("a", 2), ("b", 5)], "word string, n long")
    >>> out = ss.update_state_by_key(df, key="word", value="n",
    ...                              func=lambda new, total: (total or 0) + sum(new), state_type=int)
    >>> sorted(out.collect())
    [Row(word='a', value=3), Row(word='b', value=5)]
    """
    name = "update_state_by_key"
    keys = _key_columns(df, key, name)
    codec = _state_codec(state_type, name)
    decoder: Callable | None = None
    if value is not None:
        if value_type is not None:
            raise ConfigError(f"{name}: pass either value (a column) or value_type (whole records), not both")
        if value not in df.columns:
            raise ConfigError(f"{name}: value column {value!r} not in the input; its columns are {', '.join(df.columns)}")
        decoder = operator.itemgetter(df.columns.index(value))
    key_fields = [f for f in df.schema.fields if f.name in keys]
    key_fields.sort(key=lambda f: keys.index(f.name))
    keep = tuple(i for i, f in enumerate(codec.fields) if f not in keys)
    output_schema = StructType(
        [StructField(f.name, f.dataType, True) for f in key_fields] + [codec.columns.fields[i] for i in keep]
    )
    timeout = GroupStateTimeout.ProcessingTimeTimeout if df.isStreaming else GroupStateTimeout.NoTimeout
    return _build(
        df, operator_name=name, key=keys, func=_EveryBatch(func, codec, len(keys) == 1, df.isStreaming, keep),
        state_type=state_type, output_type=output_schema, timeout=timeout, value_type=value_type,
        initial_state=None, output_mode="update", keep_expired_state=False, state_ttl=None, flat=False,
        engine=engine, value_decoder=decoder, checkpoint=checkpoint,
    )
