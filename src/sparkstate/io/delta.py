"""The Delta Lake sink ``delta:PATH``: each micro-batch appended exactly once, through replays.

Written with the ``deltalake`` package (delta-rs, ``pip install 'sparkstate[delta]'``) from
``foreachBatch`` on the driver, not with Spark's Delta connector: the newest ``delta-spark``
on Maven Central (4.3.0) is built against Spark 4.1, and Delta's Spark integration reaches into
Spark internals that change between minor releases, so it is not a dependency we can keep in
step with pyspark 4.3. delta-rs writes the same table format, readable by Spark with Delta,
by ``deltalake`` itself, by DuckDB, Polars, Trino and others.

On PySpark 3.5, where delta-spark 3.x fits (:data:`sparkstate.io.connectors.DELTA_SPARK`), a
session that has it on its classpath with Delta's two session settings
(``--packages io.delta:delta-spark_2.12:3.3.2`` and :data:`~sparkstate.io.connectors.DELTA_SESSION`,
or the jars ``python -m sparkstate.io.connectors fetch`` resolves there, which
``sparkstate run`` adds with those settings) gets
each batch written *from the executors* by Spark's ``format("delta")`` with the same application
transaction (``txnAppId``/``txnVersion``): the batch is never collected on the driver, and the
table is the same Delta table, read back alike by ``deltalake``. Without it, or on other minors,
delta-rs writes from the driver (``deltalake`` is needed on every minor: it reads the table's
transaction for the replay check below).

How a micro-batch is written (:class:`DeltaBatchWriter`):

1. The table's *application transaction* for this stream is read: Delta keeps, per ``appId``,
   the highest ``version`` committed with it (the same mechanism as Spark's own
   ``txnAppId`` / ``txnVersion`` write options). The app id is ``sparkstate:QUERY_ID``; Spark
   keeps the query id in the checkpoint, so a restart on the same checkpoint has the same id.
2. If that version is at least the batch id, the batch was committed before (the driver died
   after the Delta commit and before Spark's commit log): it is skipped.
3. Otherwise the batch's rows (collected to the driver as Arrow, or written by the executors
   with delta-spark) are appended in ONE Delta
   commit that also sets the app transaction to the batch id: rows and batch id become
   visible together or not at all. A crash before the commit leaves at most data files that no
   commit names (readers never see them; ``VACUUM`` removes them).

On an object store (``s3a://``, ``s3://``) delta-rs is given the endpoint, region and
credentials of the session's Hadoop ``fs.s3a.*`` settings (:func:`sparkstate.fs.storage_options`),
so the table is reached as Spark's own S3A reaches it; the credentials never go anywhere else.

Empty batches commit nothing (with delta-spark: their transaction, no data file). With delta-rs the whole batch is held in driver memory while
written, as for the postgres sink: meant for the volumes of a micro-batch, not bulk loads.

>>> DeltaBatchWriter("/tmp/t")
DeltaBatchWriter('/tmp/t')
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..engines.runtime import collect_arrow
from ..errors import ConfigError, SinkError
from .query_id import batch_query_id

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("sparkstate.io.delta")

INSTALL_HINT = "pip install 'sparkstate[delta]'"


def _deltalake():
    try:
        import deltalake
    except ImportError:
        raise ConfigError(f"the delta: sink needs the deltalake package: {INSTALL_HINT}") from None
    return deltalake


def committed_version(path: str, app_id: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The last batch id committed to the table at ``path`` by ``app_id`` (``None``: none, or no table yet)."""
    deltalake = _deltalake()
    try:
        table = deltalake.DeltaTable(path, storage_options=storage_options)
    except deltalake.exceptions.TableNotFoundError:
        return None
    return table.transaction_version(app_id)


class DeltaBatchWriter:
    """The ``foreachBatch`` function of the ``delta:PATH`` sink: ``writer(batch_df, batch_id)``.

    ``app_id`` names this stream in the table's transactions; by default ``sparkstate:QUERY_ID``
    (over Spark Connect read from ``checkpoint``, the query's checkpoint location).
    """

    def __init__(self, path: str, *, app_id: str | None = None, checkpoint: str | None = None) -> None:
        self.path = path.rstrip("/") or "/"
        self.app_id = app_id
        self.checkpoint = checkpoint
        _deltalake()  # fail before the query starts when the package is missing

    def __repr__(self) -> str:
        return f"DeltaBatchWriter({self.path!r})"

    def _app_id(self, batch_df: "DataFrame") -> str:
        if self.app_id is not None:
            return self.app_id
        return f"sparkstate:{batch_query_id(batch_df, f'delta:{self.path}', 'app_id= to DeltaBatchWriter', self.checkpoint)}"

    def __call__(self, batch_df: "DataFrame", batch_id: int) -> None:
        """Append one micro-batch, or skip it if the table's transaction for this stream already has it."""
        from ..fs import storage_options

        deltalake = _deltalake()
        app_id = self._app_id(batch_df)
        options = storage_options(self.path, batch_df.sparkSession)
        done = committed_version(self.path, app_id, options)
        if done is not None and done >= batch_id:
            log.info("delta:%s: batch %d was already committed (%s at %d); skipped (replay)",
                     self.path, batch_id, app_id, done)
            # Still run the batch: a stateful query's state stores must commit it, or Spark fails the query.
            batch_df.write.format("noop").mode("overwrite").save()
            return
        if executors_write(batch_df.sparkSession):
            self._write_from_executors(batch_df, batch_id, app_id)
            return
        table = collect_arrow(batch_df)
        if table.num_rows == 0:
            return
        try:
            deltalake.write_deltalake(
                self.path, table, mode="append", storage_options=options,
                commit_properties=deltalake.CommitProperties(
                    app_transactions=[deltalake.Transaction(app_id=app_id, version=int(batch_id))]),
            )
        except Exception as exc:
            raise SinkError(f"delta:{self.path}: writing batch {batch_id} failed: {exc}") from exc
        log.info("delta:%s: batch %d committed (%d rows)", self.path, batch_id, table.num_rows)

    def _write_from_executors(self, batch_df: "DataFrame", batch_id: int, app_id: str) -> None:
        # One pass over the batch: an empty one commits its transaction with no data file
        # (checking for rows first would run the batch twice).
        try:
            batch_df.write.format("delta").mode("append").option("txnAppId", app_id) \
                .option("txnVersion", int(batch_id)).save(self.path)
        except Exception as exc:
            raise SinkError(f"delta:{self.path}: writing batch {batch_id} failed: {exc}") from exc
        log.info("delta:%s: batch %d committed from the executors (delta-spark)", self.path, batch_id)


def executors_write(spark) -> bool:
    """Whether batches go to Delta from the executors: delta-spark fits this minor, is on the
    session's classpath, and the session has Delta's settings
    (:data:`sparkstate.io.connectors.DELTA_SESSION`). Else delta-rs writes from the driver."""
    from . import connectors

    if connectors.delta_coordinates(spark.version) is None:
        return False
    if connectors.class_available(spark, connectors.DELTA_DATA_SOURCE) is not True:
        return False
    configured = all(v in (spark.conf.get(k, "") or "") for k, v in connectors.DELTA_SESSION.items())
    if not configured:
        log.warning("delta-spark is on the classpath but the session lacks %s; writing Delta from the driver"
                    " (delta-rs)", ", ".join(f"{k}={v}" for k, v in connectors.DELTA_SESSION.items()))
    return configured


def read_delta(path: str, storage_options: dict[str, str] | None = None):
    """The table at ``path`` as a pyarrow Table (for tests and tools)."""
    return _deltalake().DeltaTable(path, storage_options=storage_options).to_pyarrow_table()


__all__ = ["DeltaBatchWriter", "INSTALL_HINT", "committed_version", "read_delta"]
