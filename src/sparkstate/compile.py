"""The plan compiler: every keyed-state API is checked and compiled here, and its engine chosen once.

``map_groups_with_state`` and the operators built on it (:mod:`.operators`), the vectorized
``map_batches_with_state`` (:mod:`.vectorized`), the pipelines and ``sparkstate run`` all end in
:func:`compile_plan`: it validates the input, the key, the state and output types, the timeout,
the initial state and a checkpoint's stored state, decides the engine (:func:`choose_engine`),
and returns a :class:`Compiled` query that :meth:`Compiled.dataframe` hands to that engine.

Everything is validated when the query is defined: unknown columns, types that cannot be
encoded, a missing watermark, bad durations, an initial state that does not fit, state that
another engine or another type wrote.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from .durations import Duration, positive_ms
from .engines import TTL_ENGINE, Engine, StatePlan, default_engine, get_engine
from .engines.base import INITIAL_TIMEOUT_COLUMN, RESERVED_PREFIX, BucketLogic, has_watermark, initial_key_column
from .engines.evolution import inspect_checkpoint, key_struct
from .engines.runtime import TRANSFORM_WITH_STATE_IN_PANDAS, require
from .errors import ConfigError, StateTypeError, TimeoutConfigError
from .group_state import GroupStateTimeout
from .spark import check_session
from .shipping import ship_user_modules
from .types import Codec, encoder_for, parse_schema, record_decoder

OutputMode = Literal["update", "append"]


def choose_engine(asked: str | Engine | None, written_by: str | None = None, *, state_ttl: bool = False,
                  vectorized: bool = False) -> Engine:
    """The engine a query runs on; the one place this is decided.

    ``asked``: what the caller named (``engine=``, ``--engine``), or ``None``. ``written_by``:
    the engine that wrote the checkpoint's state, if any. A query on a checkpoint goes on with the
    engine that wrote it unless the caller names one (and a different one is then refused by
    the checkpoint check, with the way out). Otherwise: :data:`~sparkstate.engines.DEFAULT_ENGINE`,
    or :data:`~sparkstate.engines.TTL_ENGINE` when ``state_ttl`` is asked for (only it keeps
    Spark's per-key TTL); where Spark has no transformWithState (3.5), the inband engine
    (:func:`~sparkstate.engines.default_engine`). The vectorized API runs on the batched engine's layout only.

    >>> choose_engine(None).name, choose_engine(None, "tws").name, choose_engine(None, state_ttl=True).name
    ('batched', 'tws', 'tws')
    >>> type(choose_engine("batched", vectorized=True)).__name__
    'VectorizedEngine'
    """
    if vectorized:
        return _vectorized(asked)
    if asked is not None:
        return get_engine(asked)
    if written_by is not None:
        return get_engine(written_by)
    return get_engine(TTL_ENGINE if state_ttl else default_engine())


def _vectorized(asked: str | Engine | None) -> Engine:
    from .engines.batched import BatchedEngine
    from .engines.batched.vectorized import VectorizedEngine

    if isinstance(asked, VectorizedEngine):
        return asked
    if asked is None or asked == "batched":
        return VectorizedEngine()
    if isinstance(asked, BatchedEngine):
        return VectorizedEngine(asked.buckets, asked.leaf_rows, asked.pack)
    raise ConfigError(
        "map_batches_with_state: runs on the batched engine's layout only; engine must be None, 'batched' or a"
        f" ss.BatchedEngine(...), got {asked!r}"
    )


@dataclass(frozen=True)
class Compiled:
    """A checked query: the engine that runs it, its plan, and its initial state in the engine's layout."""

    engine: Engine
    plan: StatePlan
    initial: DataFrame | None

    def dataframe(self, df: DataFrame) -> DataFrame:
        """The query's output: the user's modules that are not installed travel with it."""
        ship_user_modules()
        return self.engine.apply(df, self.plan, self.initial)


def compile_plan(
    df: DataFrame,
    *,
    operator_name: str,
    key: Any,
    func: Callable,
    state_type: Any,
    output_type: Any,
    timeout: Any,
    output_mode: str,
    initial_state: DataFrame | None = None,
    value_type: Any = None,
    keep_expired_state: bool = False,
    state_ttl: Duration | None = None,
    flat: bool = False,
    engine: str | Engine | None = None,
    value_decoder: Callable | None = None,
    initial_idle_timeout_ms: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    event_time_column: str | None = None,
    vectorized: bool = False,
    bucket_logic: BucketLogic | None = None,
    every_key: bool = False,
) -> Compiled:
    """Validate everything, choose the engine and compile a :class:`StatePlan` (see the module doc).

    ``bucket_logic``: ``func``'s rules over a bucket of keys at a time (:class:`~.engines.base.BucketLogic`),
    which an engine that groups keys runs instead of calling ``func`` per key. ``every_key``:
    ``func`` is called for every stored key in each micro-batch (``update_state_by_key``), see
    :func:`every_key_timeout`."""
    if bucket_logic is not None and not isinstance(bucket_logic, BucketLogic):
        raise ConfigError(f"{operator_name}: bucket_logic must be an engines.base.BucketLogic, got {bucket_logic!r}")
    _check_input(df, func, operator_name, vectorized)
    keys = key_columns(df, key, operator_name)
    codec = state_codec(state_type, operator_name)
    if vectorized:
        from .state_batch import BOOKKEEPING

        clash = [f for f in codec.fields if f in keys or f in BOOKKEEPING]
        if clash:
            raise ConfigError(
                f"{operator_name}: state field(s) {', '.join(clash)} clash with batch.state's key or bookkeeping"
                f" columns ({', '.join(keys + BOOKKEEPING)}); rename them"
            )
    output_schema = parse_schema(output_type, "output_type")
    conf, mode, watermark, ttl_ms = time_settings(df, timeout, output_mode, state_ttl, operator_name)
    if event_time_column is not None:
        check_event_time_column(df, output_schema, event_time_column, watermark, operator_name)
    if value_decoder is None and value_type is not None:
        value_decoder = record_decoder(value_type, df.schema, "value_type")
    init_df, init_timeout = initial_state_frame(initial_state, df, keys, codec, operator_name)
    written_by = stored = None
    if checkpoint is not None:
        # An engine the caller names (the vectorized API always names the batched layout) must be
        # the one that wrote the state; without one, the query goes on with that one.
        asked = choose_engine(engine, vectorized=True).name if vectorized else \
            None if engine is None else get_engine(engine).name
        stored, _ = inspect_checkpoint(df.sparkSession, checkpoint, key_struct(df.schema, keys), codec.columns,
                                       codec.py_type, engine=asked)
        written_by = None if stored is None else stored.engine
    chosen = choose_engine(engine, written_by, state_ttl=ttl_ms is not None, vectorized=vectorized)
    if checkpoint is not None:  # layout settings fixed at the checkpoint's creation (the bucket count)
        chosen = chosen.for_checkpoint(df.sparkSession, stored, str(checkpoint))
    if every_key and df.isStreaming:
        conf, every_key = every_key_timeout(chosen, df, stored)
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
        bucket_logic=bucket_logic,
        every_key=every_key,
    )
    return Compiled(chosen, plan, init_df)


def every_key_timeout(engine: Engine, df: DataFrame, stored: Any) -> tuple[GroupStateTimeout, bool]:
    """How a streaming plan that calls every key in every micro-batch gets there: (timeout kind,
    whether the engine visits every key itself).

    The engine does it when it can (:meth:`~.engines.base.Engine.visits_every_key`): no time mode,
    so a micro-batch without input calls nothing and ``availableNow`` ends. Otherwise, and on a
    checkpoint written in processing-time mode (Spark keeps a query's time mode for the life of
    its checkpoint), each key is revisited through a 1 ms processing-time timeout that the
    operator's function sets.
    """
    written_with_timers = stored is not None and stored.operator.get("time_mode") == "ProcessingTime"
    if engine.visits_every_key(df) and not written_with_timers:
        return GroupStateTimeout.NoTimeout, True
    return GroupStateTimeout.ProcessingTimeTimeout, False


def key_columns(df: DataFrame, key: Any, operator_name: str) -> tuple[str, ...]:
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


def state_codec(state_type: Any, operator_name: str) -> Codec:
    if state_type is None:
        raise StateTypeError(f"{operator_name}: state_type is required (a dataclass, or int/float/str/bool/...)")
    codec = Codec.of(state_type, "state_type")
    bad = [f for f in codec.fields if f.startswith(RESERVED_PREFIX)]
    if bad:
        raise StateTypeError(
            f"{operator_name}: state field(s) {', '.join(bad)} use the reserved prefix {RESERVED_PREFIX!r}; rename them"
        )
    return codec


def initial_state_frame(
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


def _check_input(df: Any, func: Any, operator_name: str, vectorized: bool) -> None:
    if not isinstance(df, DataFrame):
        raise ConfigError(f"{operator_name}: expected a pyspark DataFrame as input, got {type(df).__name__}")
    if not callable(func):
        form = "func(batch) -> ss.StateUpdate" if vectorized else "func(key, values, state)"
        raise ConfigError(f"{operator_name}: func must be callable as {form}, got {func!r}")
    check_session(df.sparkSession)


def time_settings(df: DataFrame, timeout: Any, output_mode: str, state_ttl: Duration | None,
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
        require(TRANSFORM_WITH_STATE_IN_PANDAS, f"{operator_name}: state_ttl (Spark's per-key TTL of transformWithState)",
                "Expire the state with a timeout instead (timeout=ProcessingTimeTimeout).")
        if conf is GroupStateTimeout.EventTimeTimeout:
            raise TimeoutConfigError(
                f"{operator_name}: state_ttl is measured in processing time and Spark allows it only without an"
                " event-time timeout. Drop state_ttl and let the event-time timeout expire the state, or use"
                " timeout=ProcessingTimeTimeout."
            )
    return conf, mode, watermark, ttl_ms


def check_event_time_column(df: DataFrame, output_schema: StructType, column: str, watermark: bool,
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
