"""The file sinks' writers (``parquet:DIR``, ``json:DIR``): what any reader of ``DIR`` sees, at any moment.

Spark, pandas, pyarrow and DuckDB must read the same rows from a file sink's directory, exactly
once, whenever they look: while a batch is written, after a crash, after the replay of a batch.
Spark follows the sink's log (``DIR/_spark_metadata``) where there is one; the other readers list
the directory and read every data file they find, skipping names that start with ``_`` or ``.``.
So every writer here keeps two rules:

- **Nothing is written under its final name.** A batch is first written by Spark into the
  hidden staging directory ``DIR/_sparkstate_tmp`` (where Spark's own task files, partial ones
  included, stay), then each finished file is renamed into place: a file appears whole, or not
  at all.
- **Files of an attempt that did not commit do not stay.** Each batch's files have names made of
  the batch id and the file's number (``part-<batch, 10 digits>-<n, 5 digits>.<format>``), so
  before a batch is written its earlier attempt's files, and the staging directory, are deleted;
  the first batch a writer handles also deletes every ``part-`` file that the sink's log does not
  list (the leftovers of an older release, whose Spark file sink wrote in place).

:class:`FileSinkLog` (append mode on a classic session) writes flat files plus Spark's own
file-sink log (``DIR/_spark_metadata``, written last through Spark's ``FileStreamSinkLog``, so
``spark.read`` and Spark's exactly-once replay rule work as with ``writeStream.format("parquet")``).
:class:`FileBatchWriter` (update mode, and every mode over Spark Connect) writes one
``DIR/batch_id=N`` directory per batch, committed by its ``_SUCCESS`` file.

On an object store (``s3a://``) a rename is a copy and a delete: each file still appears whole
(an object is never visible half-written), the files of a batch one after another.

DuckDB's directory read (``read_parquet('DIR')``) and ``**`` globs walk into hidden
directories too (``_sparkstate_tmp``, ``_deadletter``, Spark's ``_temporary``): read a sink with
``read_parquet('DIR/*.parquet')`` (``'DIR/batch_id=*/*.parquet'`` in update mode).
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from .. import fs
from ..errors import SinkError
from ..spark import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("sparkstate.io.sinks")

#: The hidden directory of a file sink where batches are written before they are moved into place.
STAGING_DIR = "_sparkstate_tmp"
#: The sink log Spark's file sink keeps in its directory (which ``spark.read`` follows).
SINK_LOG_DIR = "_spark_metadata"
_PART = "part-"

# Spark moved its file-sink log between packages (4.1).
_SINK_LOG_CLASSES = (
    "org.apache.spark.sql.execution.streaming.sinks",
    "org.apache.spark.sql.execution.streaming",
)


def run_only(batch_df: "DataFrame") -> None:
    """Run a batch without writing it (a replay a sink already holds): its state stores still commit."""
    batch_df.write.format("noop").mode("overwrite").save()


def part_name(batch_id: int, n: int, suffix: str) -> str:
    """The name of file ``n`` of batch ``batch_id`` (``suffix``: the format's extension, with its dot).

    >>> part_name(42, 0, ".snappy.parquet")
    'part-0000000042-00000.snappy.parquet'
    """
    return f"{_PART}{batch_id:010d}-{n:05d}{suffix}"


def _suffix(name: str) -> str:
    """A file name's extensions (``.snappy.parquet``, ``.json``)."""
    return name[name.index("."):] if "." in name else ""


def _jvm_attr(jvm: Any, name: str) -> Any:
    obj = jvm
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


class _Dir:
    """A sink directory through Spark's Hadoop FileSystem (local, HDFS, object stores alike)."""

    def __init__(self, spark: "SparkSession", path: str) -> None:
        jvm: Any = spark._jvm  # Hadoop FileSystem: the same code for local, HDFS and object stores
        self.jvm = jvm
        self.Path = jvm.org.apache.hadoop.fs.Path
        root = self.Path(path)
        self.fs = root.getFileSystem(spark._jsparkSession.sessionState().newHadoopConf())
        self.root = self.fs.makeQualified(root)
        self.staging = self.Path(self.root, STAGING_DIR)

    def child(self, name: str) -> Any:
        return self.Path(self.root, name)

    def names(self, pattern: str) -> list[str]:
        """Names of the entries of the directory matching the glob ``pattern``."""
        found = self.fs.globStatus(self.Path(self.root, pattern)) or []
        return [status.getPath().getName() for status in found]

    def delete(self, path: Any) -> None:
        if self.fs.exists(path) and not self.fs.delete(path, True) and self.fs.exists(path):
            raise SinkError(f"{self.root.toString()}: could not delete {path.toString()}")

    def write_staged(self, batch_df: "DataFrame", fmt: str, batch_id: int) -> Any:
        """Write the batch with Spark into a new staging directory; return that directory."""
        where = self.Path(self.staging, f"batch_id={batch_id}-{uuid.uuid4().hex}")
        batch_df.write.format(fmt).save(where.toString())
        return where

    def data_files(self, directory: Any) -> list[Any]:
        """The data files Spark wrote into ``directory``, by name: its ``_SUCCESS`` and checksums left
        out, and empty files (Spark's JSON writer leaves a 0-byte file for an empty first partition,
        which a 0-row batch of JSON lines needs no file for and pyarrow's JSON reader refuses)."""
        files = [s.getPath() for s in self.fs.listStatus(directory)
                 if s.isFile() and s.getLen() > 0 and not s.getPath().getName().startswith(("_", "."))]
        return sorted(files, key=lambda p: p.getName())

    def move(self, src: Any, dst: Any, what: str) -> None:
        if not self.fs.rename(src, dst):
            raise SinkError(f"{what}: could not move {src.toString()} to {dst.toString()}")


class FileSinkLog:
    """Append mode: flat files in ``DIR`` and Spark's file-sink log ``DIR/_spark_metadata``.

    Batch N: skipped when the log holds it (a replay: the batch still runs, so its state stores
    commit); else the staging directory and any file of an earlier attempt at N are deleted, the
    batch is written into ``DIR/_sparkstate_tmp``, its files renamed to
    ``DIR/part-<N>-<n>.<format>`` and then listed in ``_spark_metadata/N`` (every batch gets its
    log entry, an empty batch an empty one), the way Spark's own file sink records a batch.
    Readers that follow the log (Spark) see a batch when its entry is written; the others when its
    files are renamed into place; a crash between the two leaves whole files of batch N that the
    restart deletes before it writes N again.

    The empty entry of a batch known to be empty (``rows=0``) is written in the background, while
    the stream goes on (the next call waits for it first, and raises its error): a crash can then
    leave a committed batch without its entry, and only an empty one, so the writer gives every
    batch id missing below the one it writes an empty entry (Spark's reader needs them all).
    """

    def __init__(self, spark: "SparkSession", fmt: Literal["parquet", "json"], path: str) -> None:
        self.fmt = fmt
        self.path = path.rstrip("/") or "/"
        self._what = f"{fmt}:{self.path}"  # how the log lines and errors name the sink
        self._dir = _Dir(spark, self.path)
        jvm = self._dir.jvm
        for package in _SINK_LOG_CLASSES:
            try:
                cls = _jvm_attr(jvm, f"{package}.FileStreamSinkLog")
                self._log = cls(cls.VERSION(), spark._jsparkSession, self._dir.child(SINK_LOG_DIR).toString(),
                                jvm.scala.Option.empty())
                self._status = _jvm_attr(jvm, f"{package}.SinkFileStatus")
                break
            except TypeError:  # py4j: no such class in this Spark ('JavaPackage' object is not callable)
                continue
        else:
            raise SinkError(f"{fmt}:{path}: this Spark version has no FileStreamSinkLog in"
                            f" {' or '.join(_SINK_LOG_CLASSES)} (Spark's file-sink log)")
        self._gateway: Any = spark.sparkContext._gateway
        self._swept = False
        # The log's latest batch id, read once (this writer adds every later entry), and whether
        # an attempt of this writer may have left files of a batch it did not log.
        self._last: int | None = None
        self._dirty = False
        self._later: ThreadPoolExecutor | None = None  # writes an empty batch's entry
        self._pending: Future | None = None

    def __repr__(self) -> str:
        return f"FileSinkLog({self.fmt!r}, {self.path!r})"

    def _latest(self) -> int:
        if self._last is None:
            latest = self._log.getLatestBatchId()
            self._last = int(latest.get()) if latest.isDefined() else -1
        return self._last

    def _sweep(self) -> None:
        """Delete the staging directory and every ``part-`` file the log does not list."""
        d = self._dir
        d.delete(d.staging)
        listed = {str(s.path()).rstrip("/").rsplit("/", 1)[-1] for s in self._log.allFiles()}
        for name in d.names(f"{_PART}*"):
            if name not in listed:
                log.info("%s:%s: deleting %s (an attempt that did not commit)", self.fmt, self.path, name)
                d.delete(d.child(name))
        self._swept = True

    def __call__(self, batch_df: "DataFrame", batch_id: int, rows: int | None = None) -> None:
        """Write batch ``batch_id``. ``rows``: its row count when the caller knows it (a job's
        :class:`~sparkstate.jobs.tee.JobTee`): no Spark job is then run to ask whether it is empty,
        and an empty batch gets its empty log entry without running anything, or touching the
        directory when this writer left nothing behind there."""
        what = self._what
        self._settle()
        if batch_id <= self._latest():
            log.info("%s: batch %d was already written; skipped (replay)", what, batch_id)
            run_only(batch_df)
            return
        d = self._dir
        if not self._swept:
            self._sweep()
        elif self._dirty or rows != 0:
            d.delete(d.staging)  # an earlier attempt at this batch, in this process
            for name in d.names(f"{_PART}{batch_id:010d}-*"):
                d.delete(d.child(name))
        missing = range(self._latest() + 1, batch_id)
        if missing:
            log.info("%s: batches %d to %d have no log entry (no rows; or a new directory): empty ones added",
                     what, missing[0], missing[-1])
            for n in missing:
                self._add(n, [])
        if rows == 0:
            if self._later is None:
                self._later = ThreadPoolExecutor(1, thread_name_prefix="sparkstate-sink-log")
            self._pending = self._later.submit(self._add, batch_id, [])
            self._last = batch_id
            return
        statuses = []
        self._dirty = True
        if rows is None:
            batch_df.persist()
            try:
                staged = None if batch_df.isEmpty() else d.write_staged(batch_df, self.fmt, batch_id)
            finally:
                batch_df.unpersist()
        else:
            staged = d.write_staged(batch_df, self.fmt, batch_id)
        if staged is not None:
            for n, src in enumerate(d.data_files(staged)):
                dst = d.child(part_name(batch_id, n, _suffix(src.getName())))
                d.move(src, dst, what)
                statuses.append(self._status.apply(d.fs.getFileStatus(dst)))
            d.delete(staged)
        self._add(batch_id, statuses)
        self._dirty = False

    def _add(self, batch_id: int, statuses: list) -> None:
        """Batch ``batch_id``'s entry in the log, listing ``statuses`` (its files)."""
        what = self._what
        entries = self._gateway.new_array(self._status, len(statuses))
        for i, status in enumerate(statuses):
            entries[i] = status
        if not self._log.add(batch_id, entries):
            self._last = None  # read it again
            raise SinkError(f"{what}: batch {batch_id} is already in {SINK_LOG_DIR} (another query writes this"
                            " directory?)")
        self._last = batch_id
        log.info("%s: batch %d written (%d files)", what, batch_id, len(statuses))

    def _settle(self) -> None:
        """Wait for the empty entry being written in the background, if any; its error raises here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except BaseException:
                self._last = None  # the entry may be missing: read the log again
                raise

    def flush(self) -> None:
        """Wait until every entry is in the log (an empty batch's is written in the background)."""
        self._settle()


class FileBatchWriter:
    """``foreachBatch`` function writing each micro-batch to ``DIR/batch_id=N``, exactly once.

    A batch is committed when ``DIR/batch_id=N/_SUCCESS`` exists: such a batch is skipped (it
    still runs). On a classic session the batch is written to
    ``DIR/_sparkstate_tmp/batch_id=N-<uuid>``, moved into place by one rename (atomic on local
    and HDFS file systems; file by file on an object store), and ``_SUCCESS`` is written last; a
    ``batch_id=N`` without it (an attempt that died while it was moved) is deleted first.

    Over Spark Connect (no JVM in this process, which runs beside the server's driver) the same
    steps go through :mod:`sparkstate.fs` (the local disk, or ``pyarrow.fs`` for ``s3a://``). Where
    that cannot reach ``DIR``, the batch is written straight to ``DIR/batch_id=N`` by Spark's
    writer, whose job commit renames each finished task file into place and writes ``_SUCCESS``
    last; a directory without it is overwritten. Empty batches write nothing.

    >>> FileBatchWriter("parquet", "/out")
    FileBatchWriter('parquet', '/out')
    """

    def __init__(self, fmt: Literal["parquet", "json"], path: str) -> None:
        self.fmt = fmt
        self.path = path.rstrip("/") or "/"
        self._dir: _Dir | None = None  # made at the first batch on a classic session, kept

    def __repr__(self) -> str:
        return f"FileBatchWriter({self.fmt!r}, {self.path!r})"

    def __call__(self, batch_df: "DataFrame", batch_id: int, rows: int | None = None) -> None:
        """Write batch ``batch_id``. ``rows``: its row count when the caller knows it (a job's
        :class:`~sparkstate.jobs.tee.JobTee`): no Spark job is then run to ask whether it is empty,
        and an empty batch writes nothing without running anything."""
        spark = batch_df.sparkSession
        if is_connect(spark):
            self._write_through_spark(batch_df, batch_id)
            return
        what = f"{self.fmt}:{self.path}"
        if self._dir is None:
            self._dir = _Dir(spark, self.path)
        d = self._dir
        target = d.child(f"batch_id={batch_id}")
        done = d.Path(target, "_SUCCESS")
        if d.fs.exists(done):
            log.info("%s: batch %d was already written; skipped (replay)", what, batch_id)
            run_only(batch_df)
            return
        d.delete(target)  # moved in part by an attempt that died
        for name in d.names(f"{STAGING_DIR}/batch_id={batch_id}-*"):  # left by an attempt that died
            d.delete(d.Path(d.staging, name))
        if rows is not None:
            if rows == 0:
                return
            staged = d.write_staged(batch_df, self.fmt, batch_id)
        else:
            batch_df.persist()
            try:
                if batch_df.isEmpty():
                    return
                staged = d.write_staged(batch_df, self.fmt, batch_id)
            finally:
                batch_df.unpersist()
        d.delete(d.Path(staged, "_SUCCESS"))
        for status in d.fs.listStatus(staged):
            if status.isFile() and status.getLen() == 0:  # see _Dir.data_files
                d.delete(status.getPath())
        d.move(staged, target, what)
        d.fs.create(done, True).close()
        log.info("%s: batch %d written", what, batch_id)

    def _write_through_spark(self, batch_df: "DataFrame", batch_id: int) -> None:
        spark = batch_df.sparkSession
        target = fs.join(self.path, f"batch_id={batch_id}")
        try:
            self._write_staged(batch_df, batch_id, spark, target)
        except fs.FsUnavailable as exc:
            log.warning("%s:%s: %s; batch %d is written in place", self.fmt, self.path, exc, batch_id)
            self._write_in_place(batch_df, batch_id, target)

    def _write_staged(self, batch_df: "DataFrame", batch_id: int, spark: "SparkSession", target: str) -> None:
        """The classic session's steps, through :mod:`sparkstate.fs` (this process runs beside the server's
        driver, on its file systems): raises :class:`~sparkstate.fs.FsUnavailable` before anything is written
        when it cannot reach ``DIR``."""
        what = f"{self.fmt}:{self.path}"
        if fs.exists(fs.join(target, "_SUCCESS"), spark):
            log.info("%s: batch %d was already written; skipped (replay)", what, batch_id)
            run_only(batch_df)
            return
        fs.delete(target, spark)
        staging = fs.join(self.path, STAGING_DIR)
        for name in fs.list_names(staging, spark):
            if name.startswith(f"batch_id={batch_id}-"):
                fs.delete(fs.join(staging, name), spark)
        batch_df.persist()
        try:
            if batch_df.isEmpty():
                return
            staged = fs.join(staging, f"batch_id={batch_id}-{uuid.uuid4().hex}")
            batch_df.write.format(self.fmt).save(staged)
        finally:
            batch_df.unpersist()
        for name in fs.list_names(staged, spark):
            if name == "_SUCCESS" or fs.total_bytes(fs.join(staged, name), spark) == 0:  # see _Dir.data_files
                fs.delete(fs.join(staged, name), spark)
        fs.rename(staged, target, spark)
        fs.write_text(fs.join(target, "_SUCCESS"), "", spark)
        log.info("%s: batch %d written", what, batch_id)

    def _write_in_place(self, batch_df: "DataFrame", batch_id: int, target: str) -> None:
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
        if fs.is_path_not_found(exc):
            return False
        raise
    return True


__all__ = ["SINK_LOG_DIR", "STAGING_DIR", "FileBatchWriter", "FileSinkLog", "part_name", "path_exists", "run_only"]
