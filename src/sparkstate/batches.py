"""``map_batches_with_state``: keyed state with a function over columns, called once per bucket of
keys and micro-batch (the types it takes and returns, and its rules: :mod:`.batch_state`).

It runs on the batched engine's layout (:mod:`sparkstate.engines.batched.vectorized`), so its
checkpoints, restarts, initial state and the state tools are those of the other operators on
``engine="batched"``. Everything is validated here, when the query is defined.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from pyspark.sql import DataFrame

from .batch_state import BOOKKEEPING, StateBatch, StateUpdate
from .engines import StatePlan
from .engines.base import Engine
from .engines.batched import BatchedEngine
from .engines.batched.vectorized import VectorizedEngine
from .engines.evolution import check_checkpoint, key_struct
from .errors import ConfigError
from .group_state import GroupStateTimeout
from .operators import OutputMode, _check_event_time_column, _initial_state, _key_columns, _state_codec, _time_settings
from .session import check_session
from .shipping import ship_user_modules
from .types import encoder_for, parse_schema

NAME = "map_batches_with_state"


def _engine(engine: str | Engine | None) -> VectorizedEngine:
    if engine is None or engine == "batched":
        return VectorizedEngine()
    if isinstance(engine, BatchedEngine):
        return VectorizedEngine(engine.buckets, engine.leaf_rows, engine.pack)
    raise ConfigError(
        f"{NAME}: runs on the batched engine's layout only; engine must be None, 'batched' or a"
        f" ss.BatchedEngine(...), got {engine!r}"
    )


def map_batches_with_state(
    df: DataFrame,
    key: str | Sequence[str],
    func: Callable[[StateBatch], StateUpdate],
    state_type: Any,
    output_type: Any,
    timeout: GroupStateTimeout | str = GroupStateTimeout.NoTimeout,
    initial_state: DataFrame | None = None,
    output_mode: OutputMode = "update",
    *,
    checkpoint: str | os.PathLike | None = None,
    engine: str | Engine | None = None,
    event_time_column: str | None = None,
) -> DataFrame:
    """Keep state per key; ``func(batch)`` updates many keys at once, over pandas columns.

    ``func`` is called once per bucket of keys (``engine``'s hash buckets) and micro-batch with a
    :class:`~sparkstate.StateBatch`: ``batch.rows`` (the new rows), ``batch.state`` (one row per key
    of the call: key column(s), the state's fields or ``value``, ``exists``, ``timeout_ms``,
    ``timed_out``), ``batch.watermark_ms``, ``batch.processing_time_ms``. It returns a
    :class:`~sparkstate.StateUpdate`: ``state`` (keys whose state is set, with an optional
    ``timeout_ms``), ``remove`` (keys whose state goes) and ``output`` (rows of ``output_type``).
    Keys not mentioned keep their state and timeout; a timed-out key not set again is removed.
    See docs/vectorized.md for the rules. Other arguments: as :func:`~sparkstate.map_groups_with_state`
    (``engine``: ``None``, ``"batched"`` or a :class:`~sparkstate.BatchedEngine` for its options).

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> words = spark.createDataFrame([("a",), ("b",), ("a",)], "word string")
    >>> def count(batch):
    ...     n = batch.rows.groupby("word").size().rename("n").reset_index()
    ...     s = batch.state.merge(n, on="word")
    ...     s["value"] = s["value"].fillna(0) + s["n"]
    ...     return ss.StateUpdate(state=s[["word", "value"]], output=s[["word", "value"]])
    >>> out = ss.map_batches_with_state(words, key="word", func=count, state_type=int,
    ...                                 output_type="word string, value long")
    >>> sorted(out.collect())
    [Row(word='a', value=2), Row(word='b', value=1)]
    """
    if not isinstance(df, DataFrame):
        raise ConfigError(f"{NAME}: expected a pyspark DataFrame as input, got {type(df).__name__}")
    if not callable(func):
        raise ConfigError(f"{NAME}: func must be callable as func(batch) -> ss.StateUpdate, got {func!r}")
    check_session(df.sparkSession)
    keys = _key_columns(df, key, NAME)
    codec = _state_codec(state_type, NAME)
    clash = [f for f in codec.fields if f in keys or f in BOOKKEEPING]
    if clash:
        raise ConfigError(
            f"{NAME}: state field(s) {', '.join(clash)} clash with batch.state's key or bookkeeping columns"
            f" ({', '.join(keys + BOOKKEEPING)}); rename them"
        )
    output_schema = parse_schema(output_type, "output_type")
    conf, mode, watermark, _ = _time_settings(df, timeout, output_mode, None, NAME)
    if event_time_column is not None:
        _check_event_time_column(df, output_schema, event_time_column, watermark, NAME)
    init_df, init_timeout = _initial_state(initial_state, df, keys, codec, NAME)
    chosen = _engine(engine)
    if checkpoint is not None:
        check_checkpoint(df.sparkSession, checkpoint, key_struct(df.schema, keys), codec.columns, codec.py_type,
                         engine=chosen.name)
    plan = StatePlan(
        operator=NAME, key_columns=keys, func=func, flat=False, state_codec=codec, output_schema=output_schema,
        output_encoder=encoder_for(output_schema, "output"), timeout=conf, keep_expired_state=False, state_ttl_ms=None, value_decoder=None,
        output_mode=mode, has_watermark=watermark, streaming=df.isStreaming, initial_has_timeout=init_timeout,
        event_time_column=event_time_column if df.isStreaming else None,
    )
    ship_user_modules()
    return chosen.apply(df, plan, init_df)
