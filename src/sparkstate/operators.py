"""The keyed stateful operators: ``map_groups_with_state`` and the layers built on it.

``map_groups_with_state`` / ``flat_map_groups_with_state`` hand the user's function and types
to the plan compiler (:func:`~sparkstate.compile.compile_plan`), which checks them when the query
is defined and chooses the engine; ``map_with_state`` and ``update_state_by_key`` are thin
adapters that wrap the user's function into a group function and reuse the same path, so
timeouts and expiry exist once.
"""

from __future__ import annotations

import logging
import operator
import os
from typing import Any, Callable, Iterable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import StructField, StructType

from .compile import OutputMode, compile_plan, key_columns, state_codec
from .durations import Duration
from .engines.base import Engine
from .errors import ConfigError
from .group_state import GroupState, GroupStateTimeout, State
from .spec import StateSpec
from .types import Codec

log = logging.getLogger("sparkstate")


def _build(df: DataFrame, **settings: Any) -> DataFrame:
    return compile_plan(df, **settings).dataframe(df)


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

    The plan asks for every key in every micro-batch (``StatePlan.every_key``): an engine that
    can calls each stored key in each micro-batch with input. On one that cannot (and on a
    checkpoint written that way) the query has processing-time timeouts and the key is revisited
    in every micro-batch through a 1 ms timeout (see :func:`~sparkstate.compile.every_key_timeout`).
    """

    def __init__(self, func: Callable, codec: Codec, single_key: bool, keep: tuple[int, ...]) -> None:
        self.func = func
        self.codec = codec
        self.keep = keep  # state columns that are not also key columns
        self.single_key = single_key
        self.__name__ = getattr(func, "__name__", "update_state_by_key function")

    def __call__(self, key: Any, values: Iterable[Any], gstate: GroupState) -> Any:
        new = self.func(list(values), gstate.getOption)
        if new is None:
            if gstate.exists:
                gstate.remove()
            return None
        gstate.update(new)
        if gstate.timeout_conf is GroupStateTimeout.ProcessingTimeTimeout:
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
    keys = key_columns(df, key, name)
    codec = state_codec(state_type, name)
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
    return _build(
        df, operator_name=name, key=keys, func=_EveryBatch(func, codec, len(keys) == 1, keep),
        state_type=state_type, output_type=output_schema, timeout=GroupStateTimeout.NoTimeout,
        value_type=value_type, initial_state=None, output_mode="update", keep_expired_state=False,
        state_ttl=None, flat=False, engine=engine, value_decoder=decoder, checkpoint=checkpoint, every_key=True,
    )
