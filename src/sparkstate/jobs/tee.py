"""One streaming query, two outputs: the pipeline's rows to the sink, the dead letters beside them.

A job's dead letters come from two places: the parse step (malformed records, before the
pipeline) and the pipeline itself (records it refuses, e.g. sessionize's late events, which
only the stateful operator can recognise because only it knows the watermark of the
micro-batch). A streaming query has one sink, so the job runs ONE query whose rows are either
an output row or a dead letter (columns :data:`OUT` and :data:`DEAD`, one of them null), and
:class:`JobTee` (its ``foreachBatch`` function) writes each micro-batch's two parts to their
sinks. Both writers are idempotent per batch id, so a batch that Spark runs again after a crash
is written once, and both outputs of a batch come from one execution of it (the batch is
persisted while it is split).

Per sink kind (:func:`batch_writer`), the layout is the one :func:`~sparkstate.io.sinks.start_sink`
gives, so readers cannot tell the difference:

- ``parquet:DIR`` / ``json:DIR``, append: Spark's own file sink (``FileStreamSink``: files plus
  ``DIR/_spark_metadata``; a batch id already in the log is skipped);
- the same in update mode: :class:`~sparkstate.io.sinks.FileBatchWriter` (``DIR/batch_id=N``);
- ``postgres:``: :class:`~sparkstate.io.postgres.PostgresBatchWriter` (batch id in the same
  transaction as the rows);
- ``delta:PATH``: :class:`~sparkstate.io.delta.DeltaBatchWriter` (batch id as the table's
  application transaction, in the same commit as the rows);
- ``kafka:BROKERS/TOPIC``: :class:`~sparkstate.io.kafka.KafkaBatchWriter` (at-least-once; batch
  and record ids in the message headers for consumers to drop repeats);
- ``memory[:NAME]``: a temporary view ``NAME`` over every row written so far;
- ``console``: the batch printed as a table.

>>> from sparkstate.io.sinks import parse_sink
>>> describe(parse_sink("json:/out"), "append")
'json:/out (Spark file sink: files + _spark_metadata)'
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from ..errors import SinkError
from ..io.postgres import PostgresBatchWriter
from ..io.sinks import CONSOLE_ROWS, FileBatchWriter, SinkSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("sparkstate.jobs")

#: Column of the job's query holding an output row (a struct), null on dead letters.
OUT = "_sparkstate_out"
#: Column of the job's query holding a dead letter (raw, reason, source, received_at), null on output rows.
DEAD = "_sparkstate_dead"

BatchWriter = Callable[["DataFrame", int], None]

# Spark moved its file sink between packages (4.1); the formats' classes have stayed put.
_FILE_SINK_CLASSES = (
    "org.apache.spark.sql.execution.streaming.sinks.FileStreamSink",
    "org.apache.spark.sql.execution.streaming.FileStreamSink",
)
_FILE_FORMATS = {
    "parquet": "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat",
    "json": "org.apache.spark.sql.execution.datasources.json.JsonFileFormat",
}


def _jvm_class(jvm: Any, name: str) -> Any:
    obj = jvm
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class FileSinkLog:
    """Spark's append-mode file sink, driven from ``foreachBatch``: files + ``DIR/_spark_metadata``.

    The very sink ``writeStream.format("parquet")`` uses, so the directory is read (and made
    exactly-once) the same way: a batch id already in ``_spark_metadata`` is skipped.
    """

    def __init__(self, spark: "SparkSession", fmt: str, path: str) -> None:
        self.fmt = fmt
        self.path = path
        jvm = spark._jvm
        utils = jvm.org.apache.spark.api.python.PythonUtils
        no_partitions = utils.toSeq(jvm.java.util.ArrayList())
        no_options = utils.toScalaMap(jvm.java.util.HashMap())
        file_format = _jvm_class(jvm, _FILE_FORMATS[fmt])()
        for name in _FILE_SINK_CLASSES:
            try:
                self._sink = _jvm_class(jvm, name)(spark._jsparkSession, path, file_format, no_partitions, no_options)
                break
            except TypeError:  # py4j: no such class in this Spark ('JavaPackage' object is not callable)
                continue
        else:
            raise SinkError(f"{fmt}:{path}: this Spark version has none of {', '.join(_FILE_SINK_CLASSES)}"
                            " (Spark's file sink); sparkstate needs PySpark 4.x")

    def __repr__(self) -> str:
        return f"FileSinkLog({self.fmt!r}, {self.path!r})"

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        self._sink.addBatch(batch_id, batch_df._jdf)


class MemoryTable:
    """A temporary view ``name`` over every row written so far (tests; not kept across restarts)."""

    def __init__(self, spark: "SparkSession", name: str, schema: "StructType") -> None:
        self.spark = spark  # the job's session: a view made in the batch's session would not be visible
        self.name = name
        self.schema = schema
        self.rows: list = []
        self.last_batch = -1
        self._lock = threading.Lock()
        spark.createDataFrame([], schema).createOrReplaceTempView(name)

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        with self._lock:
            if batch_id <= self.last_batch:
                return
            self.rows.extend(batch_df.collect())
            self.last_batch = batch_id
            self.spark.createDataFrame(self.rows, self.schema).createOrReplaceTempView(self.name)


class ConsoleTable:
    """Prints each batch as a table (up to :data:`~sparkstate.io.sinks.CONSOLE_ROWS` rows, values not cut)."""

    def __init__(self, title: str) -> None:
        self.title = title

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        rows = batch_df.take(CONSOLE_ROWS + 1)
        if not rows and self.title != "Batch":
            return  # no dead letters: say nothing
        line = "-" * 43
        print(f"{line}\n{self.title}: {batch_id}\n{line}", file=sys.stdout, flush=True)
        batch_df.show(CONSOLE_ROWS, truncate=False)
        sys.stdout.flush()


def describe(spec: SinkSpec, output_mode: str) -> str:
    """How :func:`batch_writer` writes ``spec`` (for logs)."""
    if spec.is_file:
        how = "Spark file sink: files + _spark_metadata" if output_mode == "append" else "one directory per batch"
        return f"{spec} ({how})"
    return str(spec)


def batch_writer(spark: "SparkSession", spec: SinkSpec, output_mode: str, schema: "StructType",
                 default_name: str, title: str = "Batch") -> BatchWriter:
    """The per-batch writer of ``spec`` (see the module docstring); ``schema`` is what it receives.

    ``default_name`` names a memory sink without a name; ``title`` heads console output.
    Creating it touches nothing but what the sink needs to exist (a postgres table, a file
    sink's ``_spark_metadata``): call it only once the job's checks have passed.
    """
    if spec.kind == "console":
        return ConsoleTable(title)
    if spec.kind == "memory":
        return MemoryTable(spark, spec.name or default_name, schema)
    if spec.is_file:
        if output_mode == "append":
            return FileSinkLog(spark, spec.kind, spec.path)
        return FileBatchWriter(spec.kind, spec.path)  # type: ignore[arg-type]
    if spec.kind == "delta":
        from ..io.delta import DeltaBatchWriter

        return DeltaBatchWriter(spec.path)  # type: ignore[arg-type]
    if spec.kind == "kafka":
        from ..io.connectors import require_kafka_connector
        from ..io.kafka import KafkaBatchWriter

        require_kafka_connector(spark, str(spec))
        return KafkaBatchWriter(spec.url, spec.table)  # type: ignore[arg-type]
    writer = PostgresBatchWriter(spec.postgres_target)
    writer.prepare(schema)
    return writer


class JobTee:
    """The ``foreachBatch`` function of a job: split each micro-batch and write both parts.

    ``batch_df`` has the columns :data:`OUT` (a struct of the output row, or null) and
    :data:`DEAD` (a struct of the dead letter, or null). The batch is persisted while it is
    split, so the stateful part of the plan runs once per batch.
    """

    def __init__(self, output: BatchWriter, dead_letters: BatchWriter | None) -> None:
        self.output = output
        self.dead_letters = dead_letters

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        from pyspark.sql import functions as F

        batch_df.persist()
        try:
            # Run the whole batch (every partition, so every state store commits) before writing:
            # on a replay both writers may skip it, and Spark refuses a batch whose stores did not commit.
            batch_df.count()
            if self.dead_letters is not None:
                self.dead_letters(batch_df.where(F.col(DEAD).isNotNull()).select(f"{DEAD}.*"), batch_id)
            self.output(batch_df.where(F.col(OUT).isNotNull()).select(f"{OUT}.*"), batch_id)
        finally:
            batch_df.unpersist()


__all__ = ["DEAD", "OUT", "BatchWriter", "ConsoleTable", "FileSinkLog", "JobTee", "MemoryTable", "batch_writer",
           "describe"]
