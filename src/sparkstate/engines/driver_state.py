"""A checkpoint's state read on the driver through Spark's own state store (PySpark 3.5).

Spark 3.5 has no state data source (the ``statestore`` and ``state-metadata`` readers came with
4.0), and PySpark has no public way to its state store. This module is the one place that
reaches it, through PySpark's JVM gateway (``spark._jvm``, a classic session's; over Spark
Connect there is none, refused in one line). It uses Spark 3.5's own classes
(``org.apache.spark.sql.execution.streaming.state``), so the files are read exactly as the
query reads them, on every filesystem Spark reaches (local, ``s3a://``, ...):

- ``StateSchemaCompatibilityChecker(providerId, hadoopConf).readSchemaFile()``: the key and
  value schemas Spark wrote for the operator (``state/<op>/0/_metadata/schema``);
- ``StateStoreProvider.createAndInit(providerId, keySchema, valueSchema, 0, storeConf,
  hadoopConf)``, with the provider class and state settings of the checkpoint's offset log;
- ``provider.getReadStore(version).iterator()``: each row's key and value (``UnsafeRow``),
  turned into a ``Row`` in the JVM (``CatalystTypeConverters``) and made a DataFrame there
  (Spark's Java ``createDataFrame``): no value crosses py4j; ``version`` is the batch id + 1, as
  Spark numbers a store's versions.

Each partition's store is opened, read and closed in turn: meant for states of few rows (the
inband engine keeps one row per bucket), read by the offline tools.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import IntegerType, StructField, StructType

from .. import fs
from ..errors import ConfigError, StateSchemaError
from ..spark import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_PACKAGE = "org.apache.spark.sql.execution.streaming.state"
#: Spark's name of a state store (the only one of the operators sparkstate builds on 3.5).
STORE_NAME = "default"


def _jvm(spark: "SparkSession") -> Any:
    if is_connect(spark):
        raise ConfigError("reading a checkpoint's state on PySpark 3.5 needs a classic Spark session (Spark's"
                          " state store is read through the driver's JVM, which a Spark Connect client has not);"
                          " read it without --remote, or from PySpark 4.0 or later")
    return spark._jvm


def _cls(jvm: Any, name: str) -> Any:
    return getattr(getattr(jvm, _PACKAGE), name) if "." not in name else getattr(jvm, name)


def _java_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return next((line.strip() for line in text if "Exception" in line or "Error" in line), text[0] if text else "")


def _provider_id(spark: "SparkSession", checkpoint: str, operator_id: int, partition: int) -> Any:
    jvm = _jvm(spark)
    store = _cls(jvm, "StateStoreId")(fs.join(checkpoint, "state"), int(operator_id), int(partition), STORE_NAME)
    return _cls(jvm, "StateStoreProviderId")(store, jvm.java.util.UUID.randomUUID())


def _hadoop_conf(spark: "SparkSession") -> Any:
    return spark._jsparkSession.sessionState().newHadoopConf()  # type: ignore[attr-defined]


def schemas(spark: "SparkSession", checkpoint: str, operator_id: int) -> "tuple[StructType, StructType] | None":
    """The key and value schemas of an operator's state rows, as Spark recorded them; ``None``
    when Spark wrote no schema file (``spark.sql.streaming.stateStore.stateSchemaCheck=false``)."""
    if not fs.exists(fs.join(checkpoint, "state", str(operator_id), "0", "_metadata", "schema"), spark):
        return None
    jvm = _jvm(spark)
    checker = _cls(jvm, "StateSchemaCompatibilityChecker")(_provider_id(spark, checkpoint, operator_id, 0),
                                                          _hadoop_conf(spark))
    pair = checker.readSchemaFile()
    return (StructType.fromJson(json.loads(pair._1().json())), StructType.fromJson(json.loads(pair._2().json())))


def _store_conf(spark: "SparkSession", conf: dict[str, str]) -> Any:
    """Spark's state store settings: the session's, then the checkpoint's over them (its offset log
    records the provider class, the compression codec and the RocksDB format the query runs with)."""
    jvm = _jvm(spark)
    sql_conf = spark._jsparkSession.sessionState().conf().clone()  # type: ignore[attr-defined]
    for k, v in conf.items():
        sql_conf.setConfString(k, str(v))
    return _cls(jvm, "StateStoreConf")(sql_conf, jvm.scala.collection.immutable.HashMap())


def checkpoint_conf(spark: "SparkSession", checkpoint: str, batch_id: int) -> dict[str, str]:
    """The SQL settings the checkpoint's offset log fixed for its query (``offsets/<batch_id>``'s
    metadata line)."""
    path = fs.join(checkpoint, "offsets", str(batch_id))
    lines = fs.read_text(path, spark).split("\n")
    try:
        meta = json.loads(lines[1])
    except (IndexError, ValueError):
        raise StateSchemaError(f"{path} is not an offset log entry of a Spark query (no metadata line)") from None
    return {str(k): str(v) for k, v in (meta.get("conf") or {}).items()}


def rows_schema(key_schema: StructType, value_schema: StructType) -> StructType:
    """The columns of :func:`state_rows`: those of Spark's ``statestore`` reader (4.0 and later)."""
    return StructType([StructField("key", key_schema, True), StructField("value", value_schema, True),
                       StructField("partition_id", IntegerType(), True)])


def _flat(key_schema: StructType, value_schema: StructType) -> StructType:
    """A key row's fields, then its value row's, as one row (named apart): what a ``JoinedRow`` of
    the two is."""
    return StructType([StructField(f"k{i}", f.dataType, True) for i, f in enumerate(key_schema.fields)]
                      + [StructField(f"v{i}", f.dataType, True) for i, f in enumerate(value_schema.fields)])


def rows(spark: "SparkSession", checkpoint: str, operator_id: int, partition: int, batch_id: int,
         key_schema: StructType, value_schema: StructType, conf: dict[str, str]) -> "DataFrame":
    """One partition's state rows as of committed batch ``batch_id``, as a DataFrame of
    :func:`_flat`'s columns. The rows stay in the JVM: each ``UnsafeRow`` pair is turned into a
    ``Row`` there (Spark's ``CatalystTypeConverters``) and the DataFrame made of the list (Spark's
    Java ``createDataFrame``); only references cross py4j, never the (large) values."""
    from pyspark.sql import DataFrame

    jvm = _jvm(spark)
    flat = _jschema(spark, _flat(key_schema, value_schema))
    to_row = jvm.org.apache.spark.sql.catalyst.CatalystTypeConverters.createToScalaConverter(flat)
    joined = jvm.org.apache.spark.sql.catalyst.expressions.JoinedRow
    out = jvm.java.util.ArrayList()
    provider = _cls(jvm, "StateStoreProvider").createAndInit(
        _provider_id(spark, checkpoint, operator_id, partition), _jschema(spark, key_schema),
        _jschema(spark, value_schema), 0, _store_conf(spark, conf), _hadoop_conf(spark))
    try:
        try:
            store = provider.getReadStore(int(batch_id) + 1)
        except Exception as exc:
            raise StateSchemaError(
                f"the state of batch {batch_id} (operator {operator_id}, partition {partition}) is not in"
                f" checkpoint {checkpoint}: {_java_message(exc)}") from None
        try:
            it = store.iterator()
            while it.hasNext():
                pair = it.next()
                out.add(to_row.apply(joined(pair.key(), pair.value())))
        finally:
            store.abort()
    finally:
        provider.close()
    return DataFrame(spark._jsparkSession.createDataFrame(out, flat), spark)  # type: ignore[attr-defined]


def _jschema(spark: "SparkSession", schema: StructType) -> Any:
    jvm = _jvm(spark)
    return jvm.org.apache.spark.sql.types.DataType.fromJson(schema.json())


def state_rows(spark: "SparkSession", checkpoint: str | os.PathLike, operator: dict[str, Any],
               batch_id: int) -> "DataFrame":
    """An operator's state rows as a DataFrame shaped as Spark 4's ``statestore`` reader gives
    them (:func:`rows_schema`), read on the driver as of committed batch ``batch_id``."""
    from functools import reduce

    from pyspark.sql import functions as F

    checkpoint = os.fspath(checkpoint)
    found = schemas(spark, checkpoint, operator["operator_id"])
    if found is None:
        raise StateSchemaError(f"checkpoint {checkpoint}: operator {operator['operator_id']} has no state schema"
                               " file (Spark writes one unless spark.sql.streaming.stateStore.stateSchemaCheck is"
                               " false); its state cannot be read on PySpark 3.5")
    key_schema, value_schema = found
    conf = checkpoint_conf(spark, checkpoint, batch_id)
    key = F.struct(*[F.col(f"k{i}").alias(f.name) for i, f in enumerate(key_schema.fields)]).alias("key")
    value = F.struct(*[F.col(f"v{i}").alias(f.name) for i, f in enumerate(value_schema.fields)]).alias("value")
    parts = [rows(spark, checkpoint, operator["operator_id"], p, batch_id, key_schema, value_schema, conf)
             .select(key, value, F.lit(p).cast("int").alias("partition_id"))
             for p in range(operator["partitions"])]
    if not parts:
        return spark.createDataFrame([], rows_schema(key_schema, value_schema))
    return reduce(lambda a, b: a.unionAll(b), parts)
