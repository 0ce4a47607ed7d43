"""``map_batches_with_state``: keyed state with a function over columns, called once per bucket of
keys and micro-batch (the types it takes and returns: :mod:`.state_batch`; its rules: :mod:`.engines.batch_rules`).

It runs on the batched engine's layout (:mod:`sparkstate.engines.batched.vectorized`), so its
checkpoints, restarts, initial state and the state tools are those of the other operators on
``engine="batched"``. It is checked when the query is defined, by the plan compiler (:mod:`.compile`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from pyspark.sql import DataFrame

from .state_batch import StateBatch, StateUpdate
from .compile import OutputMode, compile_plan
from .engines.base import Engine
from .group_state import GroupStateTimeout

NAME = "map_batches_with_state"


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
    return compile_plan(
        df, operator_name=NAME, key=key, func=func, state_type=state_type, output_type=output_type, timeout=timeout,
        output_mode=output_mode, initial_state=initial_state, engine=engine, checkpoint=checkpoint,
        event_time_column=event_time_column, vectorized=True,
    ).dataframe(df)
