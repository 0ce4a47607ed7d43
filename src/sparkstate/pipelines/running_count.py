"""The running count of each key (the seeds' streaming word count).

Built on :func:`sparkstate.map_groups_with_state`: one call per key and micro-batch adds the
batch's rows of the key to its stored count and emits the new total. The seed's
``mapWithState`` version emits a row per input record (1, 2, 3, ... within one batch); here a
key gets one row per batch with its total after the batch, which is the same running count
at batch granularity for a fraction of the output, and ``update_state_by_key`` would in
addition revisit every key ever seen in every batch.

Arrival order does not change the counts: a count is a sum, so a key's total after all its
rows is the same in any order and any micro-batch split. Which intermediate totals are emitted
(one per batch in which the key had rows) depends on the batch split, by design.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, StructField, StructType

from ..errors import ConfigError
from ..group_state import GroupState, GroupStateTimeout
from ..engines import Engine
from ..operators import flat_map_groups_with_state, map_groups_with_state
from .checks import check_column, require_dataframe
from .refusals import RefusingGroups, refusal_columns, rejected_field

NAME = "running_count"


class _Count:
    """The group function (picklable): stored count + this batch's rows."""

    __name__ = NAME

    def __call__(self, key: Any, rows: Iterable[Any], state: GroupState) -> tuple:
        total = (state.getOption or 0) + sum(1 for _ in rows)
        state.update(total)
        return (key, total)


def running_count(df: DataFrame, key: str = "word", engine: str | Engine | None = None,
                  checkpoint: str | os.PathLike | None = None, initial_state: DataFrame | None = None,
                  reason: str | None = None, carry: Sequence[str] = ()) -> DataFrame:
    """``key, count``: how many rows each ``key`` has had so far, after every micro-batch.

    One row per key and micro-batch in which the key had rows (output mode update); keys
    without rows in a batch are not repeated. A null key is counted as a key of its own.

    ``checkpoint``: the query's checkpoint; when it holds state, the state is checked against
    this pipeline's before the query starts (:class:`~sparkstate.errors.StateSchemaError`).

    ``initial_state``: the state to start from on a new checkpoint, as
    :func:`sparkstate.state.export` writes it from another query's checkpoint (the key column
    and ``value``, the count).

    ``reason``: a string column saying why a row was already refused (e.g. by a parser), null on a
    good row. A row with a reason is not counted: it comes out as a row of its own, ``count``
    null, whose column ``rejected`` (null on counts) holds ``reason`` and the ``carry`` columns
    (:mod:`sparkstate.pipelines.refusals`).

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> words = spark.createDataFrame([("spark",), ("state",), ("spark",)], "word string")
    >>> sorted(running_count(words).collect())
    [Row(word='spark', count=2), Row(word='state', count=1)]
    """
    require_dataframe(df, NAME, "rows")
    check_column(df, key, "key", NAME)
    if key == "count":
        raise ConfigError(
            f"{NAME}: the output has a column count beside the key, so the key column cannot be called"
            " 'count'; rename it first, e.g. df.withColumnRenamed('count', 'word')"
        )
    carry = refusal_columns(df, NAME, reason, carry, key)
    output = StructType([
        StructField(key, df.schema[key].dataType, True),
        StructField("count", LongType(), True),
    ])
    settings: dict[str, Any] = dict(key=key, state_type=int, timeout=GroupStateTimeout.NoTimeout, output_mode="update",
                                    engine=engine, checkpoint=checkpoint, initial_state=initial_state)
    if reason is None:
        return map_groups_with_state(df.select(key), func=_Count(), output_type=output, **settings)
    output.add(rejected_field(df, carry))
    return flat_map_groups_with_state(df.select(key, reason, *carry), func=RefusingGroups(_Count(), 1, 2),
                                      output_type=output, **settings)


__all__ = ["running_count"]
