"""One writer per sink kind: the function that writes one micro-batch of a stream to a sink.

Every sink is written through ``foreachBatch`` with the writer :func:`batch_writer` picks, by
:func:`~sparkstate.io.sinks.start_sink` (a stream to one sink) and by the jobs
(:class:`~sparkstate.jobs.tee.JobTee`: a job's output rows and dead letters, each to its sink),
so a sink's layout and its exactly-once bookkeeping exist once:

- ``parquet:DIR`` / ``json:DIR``, append: Spark's own file sink (:class:`FileSinkLog`: files plus
  ``DIR/_spark_metadata``; a batch id already in the log is skipped);
- the same in update mode: :class:`FileBatchWriter` (``DIR/batch_id=N``);
- ``postgres:``: :class:`~sparkstate.io.postgres.PostgresBatchWriter` (batch id in the same
  transaction as the rows);
- ``delta:PATH``: :class:`~sparkstate.io.delta.DeltaBatchWriter` (batch id as the table's
  application transaction, in the same commit as the rows);
- ``kafka:BROKERS/TOPIC``: :class:`~sparkstate.io.kafka.KafkaBatchWriter` (at-least-once; batch
  and record ids in the message headers for consumers to drop repeats);
- ``memory[:NAME]``: :class:`MemoryTable`, a temporary view ``NAME`` over every row written so far;
- ``console``: :class:`ConsoleTable`, the batch printed as a table.

A replayed batch that a writer already holds is skipped; the update-mode file writer still
runs it (Spark fails a stateful ``foreachBatch`` query whose state stores did not commit a
batch), the others as Spark's own file sink does (:class:`~sparkstate.jobs.tee.JobTee` runs
every batch before writing).

>>> from sparkstate.io.sinks import parse_sink
>>> describe(parse_sink("json:/out"), "append")
'json:/out (Spark file sink: files + _spark_metadata)'
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol

from ..errors import ConfigError, SinkError
from ..spark import is_connect
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
_TMP_DIR = "_sparkstate_tmp"

BatchWriter = Callable[["DataFrame", int], None]


def run_only(batch_df: "DataFrame") -> None:
    """Run a batch without writing it (a replay a sink already holds): its state stores still commit."""
    batch_df.write.format("noop").mode("overwrite").save()


class FileBatchWriter:
    """``foreachBatch`` function writing each micro-batch to ``DIR/batch_id=N``, exactly once.

    The batch is written to ``DIR/_sparkstate_tmp/batch_id=N-<uuid>`` and renamed into place
    (atomic on local and HDFS file systems); a batch whose directory already exists was
    committed before and is skipped. Empty batches write nothing.

    Over Spark Connect (no Hadoop file system in this process) the batch is written straight to
    ``DIR/batch_id=N`` by Spark's writer, whose job commit writes ``_SUCCESS`` last: a
    directory with ``_SUCCESS`` was committed and is skipped; one without (an attempt that
    died while committing) is overwritten.

    >>> FileBatchWriter("parquet", "/out")
    FileBatchWriter('parquet', '/out')
    """

    def __init__(self, fmt: Literal["parquet", "json"], path: str) -> None:
        self.fmt = fmt
        self.path = path.rstrip("/") or "/"

    def __repr__(self) -> str:
        return f"FileBatchWriter({self.fmt!r}, {self.path!r})"

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        spark = batch_df.sparkSession
        if is_connect(spark):
            self._write_through_spark(batch_df, batch_id)
            return
        jvm: Any = spark._jvm  # Hadoop FileSystem: the same code for local, HDFS and object stores
        HPath = jvm.org.apache.hadoop.fs.Path
        root = HPath(self.path)
        fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
        target = HPath(root, f"batch_id={batch_id}")
        if fs.exists(target):
            log.info("%s:%s: batch %d was already written; skipped (replay)", self.fmt, self.path, batch_id)
            run_only(batch_df)
            return
        tmp_root = HPath(root, _TMP_DIR)
        stale = fs.globStatus(HPath(tmp_root, f"batch_id={batch_id}-*")) or []
        for status in stale:  # left by an attempt that died before its rename
            fs.delete(status.getPath(), True)
        batch_df.persist()
        try:
            if batch_df.isEmpty():
                return
            tmp = HPath(tmp_root, f"batch_id={batch_id}-{uuid.uuid4().hex}")
            batch_df.write.format(self.fmt).save(tmp.toString())
        finally:
            batch_df.unpersist()
        if not fs.rename(tmp, target):
            if fs.exists(target):  # another attempt won the race
                fs.delete(tmp, True)
                return
            raise SinkError(f"{self.fmt}:{self.path}: could not move batch {batch_id} from {tmp.toString()}"
                            f" to {target.toString()}")
        log.info("%s:%s: batch %d written", self.fmt, self.path, batch_id)

    def _write_through_spark(self, batch_df: "DataFrame", batch_id: int) -> None:
        target = f"{self.path.rstrip('/')}/batch_id={batch_id}"
        if path_exists(batch_df.sparkSession, f"{target}/_SUCCESS"):
            log.info("%s:%s: batch %d was already written; skipped (replay)", self.fmt, self.path, batch_id)
            run_only(batch_df)
            return
        batch_df.persist()
        try:
            if not batch_df.isEmpty():
                batch_df.write.mode("overwrite").format(self.fmt).save(target)
                log.info("%s:%s: batch %d written", self.fmt, self.path, batch_id)
        finally:
            batch_df.unpersist()


def path_exists(spark: "SparkSession", path: str) -> bool:
    """Whether ``path`` exists where the session's Spark reads (asks Spark: no JVM needed here)."""
    from pyspark.errors import AnalysisException

    try:
        _ = spark.read.format("text").load(path).schema  # resolving the schema lists the path
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
            return False
        raise
    return True


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
        jvm: Any = spark._jvm
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
        self._sink.addBatch(batch_id, batch_df._jdf)  # skips (without running it) a batch id already in the log


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


def describe(spec: "SinkSpec", output_mode: str, connect: bool = False) -> str:
    """How :func:`batch_writer` writes ``spec`` (for logs)."""
    if spec.is_file:
        how = ("Spark file sink: files + _spark_metadata" if file_layout(output_mode, connect) == "log"
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
        from .kafka import KafkaBatchWriter

        require_kafka_connector(spark, str(spec))
        return KafkaBatchWriter(spec.url, spec.table, checkpoint=checkpoint)  # type: ignore[arg-type]
    writer = PostgresBatchWriter(spec.postgres_target, checkpoint=checkpoint)
    writer.prepare(schema)
    return writer


__all__ = ["CONSOLE_ROWS", "BatchWriter", "ConsoleTable", "FileBatchWriter", "FileSinkLog", "MemoryTable",
           "batch_writer", "describe", "file_layout", "path_exists", "run_only"]
