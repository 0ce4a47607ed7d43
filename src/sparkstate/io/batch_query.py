"""The streaming query a ``foreachBatch`` call belongs to: the key of a sink's exactly-once bookkeeping."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def batch_query_id(batch_df: "DataFrame", sink: str, override: str) -> str:
    """The id of the streaming query whose micro-batch ``batch_df`` is (stable across restarts on
    one checkpoint); ``sink`` and ``override`` (the writer's parameter that sets an id by hand)
    name the way out when the writer is called outside ``foreachBatch``."""
    query_id = batch_df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        raise SinkError(f"{sink}: no streaming query id (the writer was called outside foreachBatch); pass {override}")
    return query_id
