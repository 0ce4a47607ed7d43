"""The pages each user visited so far, optionally starting from a known state (seed 002).

Built on :func:`sparkstate.map_with_state` with ``StateSpec.initial_state``, as the seed's
``mapWithState``: the function runs once per visit and emits the user's list after that visit,
so a user with two visits in one micro-batch gets two rows (the seed's outputs exactly). A
per-batch operator would emit only the second; here the per-record output is the point.

The result depends on arrival order, by the seed's definition: a list of pages in the order they
were visited as the stream delivers them (the visits carry no time). Across micro-batches that is
the batches' order; within a batch, the order Spark hands a user's rows to the function (the
order of the rows in one file for a file source). This is the seed's meaning and is kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType

from ..errors import ConfigError
from ..group_state import State
from ..engines import Engine
from ..operators import map_with_state
from ..spec import StateSpec
from .checks import check_column, require_dataframe
from .refusals import RefusingRecords, refusal_columns, rejected_field

NAME = "visited_pages"

#: The state column of an initial state (beside the key column), and of the output.
PAGES_COLUMN = "visited_pages"


@dataclass
class VisitedPages:
    """The state of one key: the pages visited so far, oldest first."""

    visited_pages: list[str] = field(default_factory=list)


class _TrackVisit:
    """The per-record function (picklable): append the page, emit the whole list."""

    __name__ = NAME

    def __call__(self, key: Any, page: str, state: State) -> tuple:
        pages = (state.get().visited_pages if state.exists() else []) + [page]
        state.update(VisitedPages(pages))
        return (key, pages)


def _initial(initial_state: Any, visits: DataFrame, key: str) -> DataFrame:
    if not isinstance(initial_state, DataFrame):
        raise ConfigError(
            f"{NAME}: initial_state must be a DataFrame with columns {key}, {PAGES_COLUMN} (array<string>),"
            f" got {type(initial_state).__name__}"
        )
    if initial_state.isStreaming:
        raise ConfigError(f"{NAME}: initial_state must be a static DataFrame (spark.read...), not a stream")
    missing = [c for c in (key, PAGES_COLUMN) if c not in initial_state.columns]
    if missing:
        raise ConfigError(
            f"{NAME}: initial_state must have the columns {key} (the key) and {PAGES_COLUMN} (array<string>);"
            f" missing {', '.join(missing)}; it has {', '.join(initial_state.columns)}"
        )
    pages_type = initial_state.schema[PAGES_COLUMN].dataType
    if not isinstance(pages_type, ArrayType):
        raise ConfigError(
            f"{NAME}: initial_state column {PAGES_COLUMN} must be an array<string>, but it is"
            f" {pages_type.simpleString()}"
        )
    return initial_state.select(
        F.col(key).cast(visits.schema[key].dataType).alias(key),
        F.col(PAGES_COLUMN).cast("array<string>").alias(PAGES_COLUMN),
    )


def visited_pages(
    visits: DataFrame, key: str = "user_id", page: str = "page", initial_state: DataFrame | None = None,
    engine: str | Engine | None = None, checkpoint: str | os.PathLike | None = None,
    reason: str | None = None, carry: Sequence[str] = (),
) -> DataFrame:
    """``key, visited_pages``: after every visit, the list of pages its user visited so far.

    ``initial_state``: a static DataFrame of ``key`` and ``visited_pages`` (``array<string>``)
    that the lists start from; it applies when the query starts on a new checkpoint (a restart
    continues from the checkpoint's state). Visits of a user within a micro-batch are appended
    in the order Spark delivers them (the file's order for one file); visits with a null
    ``page`` are left out. Output mode update, one row per visit.

    ``checkpoint``: the query's checkpoint; when it holds state, the state is checked against
    this pipeline's before the query starts (:class:`~sparkstate.errors.StateSchemaError`).

    ``reason``: a string column saying why a visit was already refused (e.g. by a parser), null
    on a good one. A visit with a reason changes no list: it comes out as a row of its own,
    ``visited_pages`` null, whose column ``rejected`` (null on lists) holds ``reason`` and the
    ``carry`` columns (:mod:`sparkstate.pipelines.refusals`).

    >>> import sparkstate as ss
    >>> spark = ss.spark_session()
    >>> start = spark.createDataFrame([("a", ["page1", "page2"])], "user_id string, visited_pages array<string>")
    >>> visits = spark.createDataFrame([("a", "page3"), ("b", "page5")], "user_id string, page string")
    >>> for r in visited_pages(visits, initial_state=start).orderBy("user_id").collect():
    ...     print(r.user_id, ", ".join(r.visited_pages))
    a page1, page2, page3
    b page5
    """
    require_dataframe(visits, NAME, "visits")
    check_column(visits, key, "key", NAME)
    check_column(visits, page, "page", NAME)
    if key == PAGES_COLUMN:
        raise ConfigError(
            f"{NAME}: the output has a column {PAGES_COLUMN} beside the key, so the key column cannot be"
            f" called {PAGES_COLUMN!r}; rename it first"
        )
    if key == page:
        raise ConfigError(f"{NAME}: key and page must be two different columns, both are {key!r}")
    carry = refusal_columns(visits, NAME, reason, carry, key, (page,))
    output = StructType([
        StructField(key, visits.schema[key].dataType, True),
        StructField(PAGES_COLUMN, ArrayType(StringType(), True), True),
    ])
    kept = F.col(page).isNotNull()
    if reason is None:
        spec, value, refusal = StateSpec.function(_TrackVisit()), page, []
    else:  # whole records (key, page, reason, carry...): a refused one never reaches _TrackVisit
        spec, value, refusal = StateSpec.function(RefusingRecords(_TrackVisit(), 1, 2, 2)), None, [reason, *carry]
        kept = kept | F.col(reason).isNotNull()
        output.add(rejected_field(visits, carry))
    if initial_state is not None:
        spec = spec.initial_state(_initial(initial_state, visits, key))
    df = visits.where(kept).select(F.col(key), F.col(page).cast("string").alias(page), *map(F.col, refusal))
    return map_with_state(df, key=key, value=value, spec=spec, state_type=VisitedPages, output_type=output,
                          engine=engine, checkpoint=checkpoint)


__all__ = ["PAGES_COLUMN", "VisitedPages", "visited_pages"]
