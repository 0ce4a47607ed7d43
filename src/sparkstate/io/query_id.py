"""The streaming query a ``foreachBatch`` call belongs to: the key of a sink's exactly-once bookkeeping."""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

from .. import fs
from ..engines.checkpoint import METADATA, query_id_of, stored_query_id
from ..errors import SinkError
from ..spark import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_ids: dict[str, str] = {}


def checkpoint_query_id(spark: "SparkSession", checkpoint: str) -> str:
    """The query id a checkpoint keeps (its ``metadata`` file, written when the query first
    starts), read through Spark so the path may be anywhere the server reads."""
    if checkpoint not in _ids:
        line = spark.read.text(f"{checkpoint.rstrip('/')}/{METADATA}").first()
        if line is None:
            raise SinkError(f"checkpoint {checkpoint}: its metadata file is empty; it names no query id")
        _ids[checkpoint] = query_id_of(line[0])
    return _ids[checkpoint]


def own_query_id(spark: "SparkSession", checkpoint: str) -> str:
    """The query id a query started on ``checkpoint`` will have, known before it starts: the one the
    checkpoint keeps, or a new one written into it (Spark takes a ``metadata`` file it finds as
    the query's, and writes one only when there is none). On any filesystem :mod:`sparkstate.fs`
    reaches; raises :class:`~sparkstate.fs.FsUnavailable` where it reaches none."""
    query_id = stored_query_id(spark, checkpoint)
    if query_id is not None:
        return query_id
    query_id = str(uuid.uuid4())
    fs.write_text(fs.join(checkpoint, METADATA), json.dumps({"id": query_id}) + "\n", spark)
    return query_id


def batch_query_id(batch_df: "DataFrame", sink: str, override: str, checkpoint: str | None = None) -> str:
    """The id of the streaming query whose micro-batch ``batch_df`` is (stable across restarts on
    one checkpoint); ``sink`` and ``override`` (the writer's parameter that sets an id by hand)
    name the way out when the writer is called outside ``foreachBatch``.

    A classic session knows it from the batch's thread; over Spark Connect the batch runs in a
    session of its own on the server, and the id is read from ``checkpoint``.
    """
    spark = batch_df.sparkSession
    if is_connect(spark):
        if checkpoint is None:
            raise SinkError(f"{sink}: over Spark Connect the query id is read from the checkpoint; pass checkpoint="
                            f" (the query's checkpointLocation) or {override}")
        return checkpoint_query_id(spark, checkpoint)
    query_id = spark.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        raise SinkError(f"{sink}: no streaming query id (the writer was called outside foreachBatch); pass {override}")
    return query_id
