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
  turned into Python values field by field with the row's accessors; ``version`` is the batch
  id + 1, as Spark numbers a store's versions.

Each partition's store is opened, read and closed in turn: meant for states of few rows (the
inband engine keeps one row per bucket), read by the offline tools.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    BinaryType, BooleanType, ByteType, DataType, DoubleType, FloatType, IntegerType, LongType, ShortType, StringType,
    StructField, StructType,
)

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


_SCALARS: dict[type, str] = {
    BooleanType: "getBoolean", ByteType: "getByte", ShortType: "getShort", IntegerType: "getInt",
    LongType: "getLong", FloatType: "getFloat", DoubleType: "getDouble",
}


def _value(row: Any, i: int, dt: DataType) -> Any:
    if row.isNullAt(i):
        return None
    if isinstance(dt, StructType):
        return _values(row.getStruct(i, len(dt.fields)), dt)
    if isinstance(dt, BinaryType):
        return bytes(row.getBinary(i))
    if isinstance(dt, StringType):
        return row.getUTF8String(i).toString()
    getter = _SCALARS.get(type(dt))
    if getter is None:
        raise StateSchemaError(f"a state row's {dt.simpleString()} column cannot be read on PySpark 3.5 (only"
                               " numbers, booleans, strings, binary and structs of them)")
    return getattr(row, getter)(i)


def _values(row: Any, schema: StructType) -> tuple:
    return tuple(_value(row, i, f.dataType) for i, f in enumerate(schema.fields))


def rows_schema(key_schema: StructType, value_schema: StructType) -> StructType:
    """The shape of :func:`rows`: that of Spark's ``statestore`` reader (4.0 and later)."""
    return StructType([StructField("key", key_schema, True), StructField("value", value_schema, True),
                       StructField("partition_id", IntegerType(), True)])


def rows(spark: "SparkSession", checkpoint: str, operator_id: int, partitions: int, batch_id: int,
         key_schema: StructType, value_schema: StructType, conf: dict[str, str]) -> list[tuple]:
    """Every state row of an operator as of committed batch ``batch_id``: ``(key, value,
    partition_id)``, key and value as tuples of :func:`schemas`' fields."""
    jvm = _jvm(spark)
    store_conf = _store_conf(spark, conf)
    hadoop = _hadoop_conf(spark)
    create = _cls(jvm, "StateStoreProvider").createAndInit
    out: list[tuple] = []
    for p in range(partitions):
        provider = create(_provider_id(spark, checkpoint, operator_id, p), _jschema(spark, key_schema),
                          _jschema(spark, value_schema), 0, store_conf, hadoop)
        try:
            try:
                store = provider.getReadStore(int(batch_id) + 1)
            except Exception as exc:
                raise StateSchemaError(
                    f"the state of batch {batch_id} (operator {operator_id}, partition {p}) is not in checkpoint"
                    f" {checkpoint}: {_java_message(exc)}") from None
            try:
                it = store.iterator()
                while it.hasNext():
                    pair = it.next()
                    out.append((_values(pair.key(), key_schema), _values(pair.value(), value_schema), p))
            finally:
                store.abort()
        finally:
            provider.close()
    return out


def _jschema(spark: "SparkSession", schema: StructType) -> Any:
    jvm = _jvm(spark)
    return jvm.org.apache.spark.sql.types.DataType.fromJson(schema.json())


def state_rows(spark: "SparkSession", checkpoint: str | os.PathLike, operator: dict[str, Any],
               batch_id: int) -> "DataFrame":
    """An operator's state rows as a DataFrame shaped as Spark 4's ``statestore`` reader gives
    them (:func:`rows_schema`), read on the driver as of committed batch ``batch_id``."""
    checkpoint = os.fspath(checkpoint)
    found = schemas(spark, checkpoint, operator["operator_id"])
    if found is None:
        raise StateSchemaError(f"checkpoint {checkpoint}: operator {operator['operator_id']} has no state schema"
                               " file (Spark writes one unless spark.sql.streaming.stateStore.stateSchemaCheck is"
                               " false); its state cannot be read on PySpark 3.5")
    key_schema, value_schema = found
    conf = checkpoint_conf(spark, checkpoint, batch_id)
    data = rows(spark, checkpoint, operator["operator_id"], operator["partitions"], batch_id, key_schema,
                value_schema, conf)
    return spark.createDataFrame(data, rows_schema(key_schema, value_schema))
