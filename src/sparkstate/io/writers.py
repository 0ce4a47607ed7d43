"""One writer per sink kind: the function that writes one micro-batch of a stream to a sink.

Every sink is written through ``foreachBatch`` with the writer :func:`batch_writer` picks, by
:func:`~sparkstate.io.sinks.start_sink` (a stream to one sink) and by the jobs
(:class:`~sparkstate.jobs.tee.JobTee`: a job's output rows and dead letters, each to its sink),
so a sink's layout and its exactly-once bookkeeping exist once:

- ``parquet:DIR`` / ``json:DIR``, append: :class:`~sparkstate.io.files.FileSinkLog` (files plus
  Spark's file-sink log ``DIR/_spark_metadata``; a batch id already in the log is skipped);
- the same in update mode: :class:`~sparkstate.io.files.FileBatchWriter` (``DIR/batch_id=N``);
  both write through a hidden staging directory, so that every reader of ``DIR`` sees whole
  files of committed batches (see :mod:`sparkstate.io.files`);
- ``postgres:``: :class:`~sparkstate.io.postgres.PostgresBatchWriter` (batch id in the same
  transaction as the rows);
- ``delta:PATH``: :class:`~sparkstate.io.delta.DeltaBatchWriter` (batch id as the table's
  application transaction, in the same commit as the rows);
- ``kafka:BROKERS/TOPIC``: :class:`~sparkstate.io.kafka.KafkaBatchWriter` (at-least-once; batch
  and record ids in the message headers for consumers to drop repeats);
- ``memory[:NAME]``: :class:`MemoryTable`, a temporary view ``NAME`` over every row written so far;
- ``console``: :class:`ConsoleTable`, the batch printed as a table.

A replayed batch that a writer already holds is skipped; the file writers still run it (Spark
fails a stateful ``foreachBatch`` query whose state stores did not commit a batch), the others
as Spark's own file sink does (:class:`~sparkstate.jobs.tee.JobTee` runs every batch before
writing).

>>> from sparkstate.io.sinks import parse_sink
>>> describe(parse_sink("json:/out"), "append")
'json:/out (files + _spark_metadata)'
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Callable, Literal, Protocol

from ..errors import ConfigError
from ..spark import is_connect
from .files import FileBatchWriter, FileSinkLog, path_exists, run_only
from .kafka import KafkaBatchWriter
from .postgres import PostgresBatchWriter, PostgresTarget

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


class SinkSpec(Protocol):
    """What a writer is chosen by: a parsed sink spec (:class:`sparkstate.io.sinks.SinkSpec`).
    Written here as a protocol so that this module does not import the module that parses specs."""

    # read-only (properties): a parsed spec is a frozen dataclass, whose fields cannot be set
    @property
    def kind(self) -> str: ...

    @property
    def path(self) -> str | None: ...

    @property
    def url(self) -> str | None: ...

    @property
    def table(self) -> str | None: ...

    @property
    def name(self) -> str | None: ...

    @property
    def is_file(self) -> bool: ...

    @property
    def postgres_target(self) -> PostgresTarget: ...

log = logging.getLogger("sparkstate.io.sinks")

#: Console sink: rows shown per micro-batch.
CONSOLE_ROWS = 100

BatchWriter = Callable[["DataFrame", int], None]


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
    """Prints each batch as a table (up to :data:`CONSOLE_ROWS` rows, values not cut)."""

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


def write_counted(writer: BatchWriter, batch_df: "DataFrame", batch_id: int, rows: int) -> None:
    """Write ``batch_df``, which has ``rows`` rows (counted already, as
    :class:`~sparkstate.jobs.tee.JobTee` counts each part of a batch in the one job that runs it), with
    no Spark job spent asking whether it is empty.

    The file writers take the count (an empty batch still gets its entry in Spark's file-sink
    log, which needs one per batch); the console shows an empty output batch; every other writer
    is not called for an empty batch (it would write nothing: no rows, no files, no messages).
    """
    if isinstance(writer, (FileSinkLog, FileBatchWriter)):
        writer(batch_df, batch_id, rows)
    elif rows > 0 or isinstance(writer, ConsoleTable):
        writer(batch_df, batch_id)


def writes_uncounted(writer: BatchWriter) -> bool:
    """Whether ``writer`` takes a part of a batch before anyone counted it, and writes it in the job that
    runs the batch: the Kafka sink, whose messages go out as the batch's tasks produce them, and
    for which an empty part is nothing to write and nothing to record. A job's output then leaves
    as soon as its batch is computed (:class:`~sparkstate.jobs.tee.JobTee`). Every other writer is
    given the count first (:func:`write_counted`): a file sink records each batch, an empty one
    too, and the Delta and PostgreSQL writers would commit an empty transaction."""
    return isinstance(writer, KafkaBatchWriter)


def describe(spec: "SinkSpec", output_mode: str, connect: bool = False) -> str:
    """How :func:`batch_writer` writes ``spec`` (for logs)."""
    if spec.is_file:
        how = ("files + _spark_metadata" if file_layout(output_mode, connect) == "log"
               else "one directory per batch")
        return f"{spec} ({how})"
    return str(spec)


def file_layout(output_mode: str, connect: bool) -> Literal["log", "batches"]:
    """How a file sink lays out a stream's output: Spark's file-sink log (``_spark_metadata``, append
    mode on a classic session) or one ``batch_id=N`` directory per batch (update mode, and every
    mode over Spark Connect, where Spark's file-sink log cannot be driven from ``foreachBatch``).

    >>> file_layout("append", False), file_layout("append", True), file_layout("update", False)
    ('log', 'batches', 'batches')
    """
    return "log" if output_mode == "append" and not connect else "batches"


def batch_writer(spark: "SparkSession", spec: "SinkSpec", output_mode: str, schema: "StructType",
                 default_name: str, title: str = "Batch", checkpoint: str | None = None) -> BatchWriter:
    """The per-batch writer of ``spec`` (see the module docstring); ``schema`` is what it receives.

    ``default_name`` names a memory sink without a name; ``title`` heads console output.
    Creating it touches nothing but what the sink needs to exist (a postgres table, a file
    sink's ``_spark_metadata``, a memory sink's empty view): call it only once every check
    has passed. ``checkpoint`` (the query's) is where the postgres, Delta and Kafka writers
    read the query id over Spark Connect.
    """
    connect = is_connect(spark)
    if spec.kind == "console":
        return ConsoleTable(title)
    if spec.kind == "memory":
        if connect:
            raise ConfigError(f"{spec}: the memory sink keeps rows in this Python process, and over Spark Connect"
                              " each batch is written on the server; use parquet:DIR or delta:PATH and read it"
                              " back, or writeStream.format('memory') for Spark's own")
        return MemoryTable(spark, spec.name or default_name, schema)
    if spec.is_file:
        if file_layout(output_mode, connect) == "log":
            return FileSinkLog(spark, spec.kind, spec.path)  # type: ignore[arg-type]
        return FileBatchWriter(spec.kind, spec.path)  # type: ignore[arg-type]
    if spec.kind == "delta":
        from .delta import DeltaBatchWriter

        return DeltaBatchWriter(spec.path, checkpoint=checkpoint)  # type: ignore[arg-type]
    if spec.kind == "kafka":
        from .connectors import require_kafka_connector

        require_kafka_connector(spark, str(spec))
        return KafkaBatchWriter(spec.url, spec.table, checkpoint=checkpoint)  # type: ignore[arg-type]
    writer = PostgresBatchWriter(spec.postgres_target, checkpoint=checkpoint)
    writer.prepare(schema)
    return writer


__all__ = ["CONSOLE_ROWS", "BatchWriter", "ConsoleTable", "FileBatchWriter", "FileSinkLog", "MemoryTable",
           "batch_writer", "describe", "file_layout", "path_exists", "run_only", "write_counted",
           "writes_uncounted"]
