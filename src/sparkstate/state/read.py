"""Read a sparkstate query's state from its checkpoint, without running the query.

Built on Spark's ``statestore`` and ``state-metadata`` readers; this module knows how
sparkstate lays a key's state out (``engines/base.py``) and undoes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engines.base import (EXISTS_COLUMN, INITIAL_TIMEOUT_COLUMN, LEGACY_STATE_VARIABLE, SCHEMA_FIELD, STATE_FIELD,
                            STATE_VARIABLE, TIMEOUT_COLUMN, TIMEOUT_FIELD)
from ..engines.batched import BUCKET_COLUMN, DIR_VARIABLE, LEAF_VARIABLE
from ..errors import StateSchemaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


def _path(checkpoint: str | os.PathLike) -> str:
    return str(checkpoint)


def has_state(checkpoint: str | os.PathLike) -> bool:
    """Whether a checkpoint directory holds committed state (at least one committed batch)."""
    root = Path(checkpoint)
    return (root / "state").is_dir() and any((root / "commits").glob("[0-9]*"))


def operators(spark: "SparkSession", checkpoint: str | os.PathLike) -> list[dict[str, Any]]:
    """The stateful operators of a checkpoint: id, name, partitions, batches, time mode, variables."""
    rows = spark.read.format("state-metadata").load(_path(checkpoint)).collect()
    out = []
    for r in rows:
        props = json.loads(r.operatorProperties) if r.operatorProperties else {}
        out.append({
            "operator_id": r.operatorId,
            "operator": r.operatorName,
            "partitions": r.numPartitions,
            "min_batch_id": r.minBatchId,
            "max_batch_id": r.maxBatchId,
            "time_mode": props.get("timeMode"),
            "output_mode": props.get("outputMode"),
            "state_variables": [v.get("stateName") for v in props.get("stateVariables", [])],
        })
    return out


def _layout_of(op: dict[str, Any]) -> tuple[str, int] | None:
    """(engine, layout version) of a sparkstate operator's state, or None for another operator."""
    names = op["state_variables"]
    if STATE_VARIABLE in names:
        return "tws", 2
    if LEGACY_STATE_VARIABLE in names:
        return "tws", 1  # state fields as Spark columns (earlier releases)
    if DIR_VARIABLE in names and LEAF_VARIABLE in names:
        return "batched", 1
    return None


def _engine_of(op: dict[str, Any]) -> str | None:
    layout = _layout_of(op)
    return None if layout is None else layout[0]


def _sparkstate_operator(spark: "SparkSession", checkpoint: str | os.PathLike) -> dict[str, Any]:
    if not Path(checkpoint).exists():
        raise StateSchemaError(f"checkpoint {checkpoint} does not exist")
    if not has_state(checkpoint):
        raise StateSchemaError(f"checkpoint {checkpoint} has no committed state yet (no batch has completed)")
    ops = operators(spark, checkpoint)
    ours = [dict(o, engine=_engine_of(o), layout=_layout_of(o)[1]) for o in ops if _engine_of(o)]
    if not ours:
        found = "; ".join(f"{o['operator']} with state {', '.join(o['state_variables']) or '(none listed)'}" for o in ops)
        raise StateSchemaError(
            f"checkpoint {checkpoint} does not hold sparkstate state: it has {found or 'no stateful operator'}."
            " Point at the checkpoint of a query built with sparkstate."
        )
    if len(ours) > 1:
        raise StateSchemaError(
            f"checkpoint {checkpoint} has {len(ours)} sparkstate operators; reading several is not supported yet"
        )
    return ours[0]


def engine_of(spark: "SparkSession", checkpoint: str | os.PathLike) -> str:
    """The engine (``"tws"`` or ``"batched"``) whose layout a checkpoint's state has."""
    return _sparkstate_operator(spark, checkpoint)["engine"]


def _variable(spark: "SparkSession", checkpoint: str | os.PathLike, op: dict[str, Any], name: str,
              batch_id: int | None) -> "DataFrame":
    reader = spark.read.format("statestore").option("stateVarName", name).option("operatorId", op["operator_id"])
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(_path(checkpoint))


def _directories(spark: "SparkSession", checkpoint: str | os.PathLike, op: dict[str, Any],
                 batch_id: int | None) -> dict[int, Any]:
    from ..engines.batched import Directory

    rows = _variable(spark, checkpoint, op, DIR_VARIABLE, batch_id).collect()
    return {r.key[0]: Directory.loads(r.value.blob) for r in rows}


def _batched_schemas(dirs: dict[int, Any]) -> tuple["StructType", "StructType"]:
    """The key and state schemas most buckets were last written with (buckets not touched since an
    upgrade still hold the older one; their rows are matched to it by field name)."""
    from collections import Counter

    from pyspark.sql.types import StructType

    if not dirs:
        raise StateSchemaError("the checkpoint's state is empty (no key was ever stored)")
    key_json = Counter(d.key_schema for d in dirs.values()).most_common(1)[0][0]
    state_json = Counter(d.state_schema for d in dirs.values()).most_common(1)[0][0]
    return StructType.fromJson(json.loads(key_json)), StructType.fromJson(json.loads(state_json))


def _coercer(dt: Any) -> Any:
    """A function fitting a value stored under an older state type to ``dt`` (numbers widened,
    structs matched by field name, missing fields null), as Spark's ``createDataFrame`` takes it."""
    from pyspark.sql import Row
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, MapType, StructType

    if isinstance(dt, (DoubleType, FloatType)):
        return lambda v: None if v is None else float(v)
    if isinstance(dt, StructType):
        names = dt.names
        subs = [_coercer(f.dataType) for f in dt.fields]

        def struct(v: Any) -> Any:
            if v is None:
                return None
            if isinstance(v, Row) and hasattr(v, "__fields__"):
                d = v.asDict()
                return tuple(c(d.get(n)) for n, c in zip(names, subs))
            if isinstance(v, dict):
                return tuple(c(v.get(n)) for n, c in zip(names, subs))
            return tuple(c(x) for c, x in zip(subs, v))
        return struct
    if isinstance(dt, ArrayType):
        elem = _coercer(dt.elementType)
        return lambda v: None if v is None else [elem(x) for x in v]
    if isinstance(dt, MapType):
        kc, vc = _coercer(dt.keyType), _coercer(dt.valueType)
        return lambda v: None if v is None else {kc(k): vc(x) for k, x in v.items()}
    return lambda v: v


def _relayer(stored: "StructType", target: "StructType") -> Any:
    """Columns written under ``stored`` -> columns of ``target`` (by name; missing ones null)."""
    pos = {n: i for i, n in enumerate(stored.names)}
    plan = [(pos.get(f.name), _coercer(f.dataType)) for f in target.fields]
    return lambda cols: tuple(None if i is None else c(cols[i]) for i, c in plan)


def _tws_state_types(raw: "DataFrame") -> dict[str, int]:
    """Layout 2: each state type tag found in the rows, with its number of keys."""
    return {r[0]: r[1] for r in raw.groupBy(f"value.{SCHEMA_FIELD}").count().collect() if r[0] is not None}


def _records(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None) -> "DataFrame":
    """One row per stored key, whatever the engine: ``partition_id``, the key columns (under
    ``key``), the state's fields (under ``value``), its timeout and whether state exists."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, IntegerType, LongType, StructField, StructType

    from ..types import parse_type_tag

    op = _sparkstate_operator(spark, checkpoint)
    if op["engine"] == "tws" and op["layout"] == 1:
        raw = _variable(spark, checkpoint, op, LEGACY_STATE_VARIABLE, batch_id)
        fields = [f for f in raw.schema["value"].dataType.names if f not in (EXISTS_COLUMN, TIMEOUT_COLUMN)]
        return raw.select(
            "partition_id", "key",
            F.struct(*[F.col(f"value.`{f}`").alias(f) for f in fields]).alias("value"),
            F.col(f"value.`{TIMEOUT_COLUMN}`").alias(INITIAL_TIMEOUT_COLUMN),
            F.col(f"value.`{EXISTS_COLUMN}`").alias(EXISTS_COLUMN),
        )

    def schema_of(key_schema: Any, state_schema: Any) -> Any:
        return StructType([
            StructField("partition_id", IntegerType(), True),
            StructField("key", key_schema, True),
            StructField("value", state_schema, True),
            StructField(INITIAL_TIMEOUT_COLUMN, LongType(), True),
            StructField(EXISTS_COLUMN, BooleanType(), True),
        ])

    if op["engine"] == "tws":
        raw = _variable(spark, checkpoint, op, STATE_VARIABLE, batch_id)
        key_schema = raw.schema["key"].dataType
        tags = _tws_state_types(raw)
        target_tag = max(tags, key=lambda t: (tags[t], t)) if tags else "struct<>"
        target = parse_type_tag(target_tag)
        relayers = {t: _relayer(parse_type_tag(t), target) for t in tags if t != target_tag}

        def decode_tws(row: Any) -> Any:
            import pickle

            part, key, (tag, blob, timeout) = row
            cols = None
            if blob is not None:
                cols = pickle.loads(blob)
                if tag != target_tag:
                    cols = relayers[tag](cols)
            return (part, tuple(key), cols, timeout, cols is not None)

        rows = raw.select("partition_id", "key", F.struct(*[F.col(f"value.`{f}`") for f in
                                                            (SCHEMA_FIELD, STATE_FIELD, TIMEOUT_FIELD)])).rdd.map(decode_tws)
        return spark.createDataFrame(rows, schema_of(key_schema, target))

    dirs = _directories(spark, checkpoint, op, batch_id)
    key_schema, state_schema = _batched_schemas(dirs)
    # every bucket's columns are fitted to the target: a leaf re-laid after a type change still
    # holds the values of keys not called since (an int where the field is now a double)
    bucket_relayers = {b: _relayer(StructType.fromJson(json.loads(d.state_schema)), state_schema)
                       for b, d in dirs.items()}
    default_fit = _relayer(state_schema, state_schema)
    single = len(key_schema.fields) == 1

    def decode(row: Any) -> Any:
        import pickle

        fit = bucket_relayers.get(row[0], default_fit)
        for k, (cols, timeout, _h) in pickle.loads(row[1]).items():
            if cols is not None and fit is not None:
                cols = fit(cols)
            keys = (k,) if single else tuple(k)
            yield (row[2], keys, cols, timeout, cols is not None)

    leaves = _variable(spark, checkpoint, op, LEAF_VARIABLE, batch_id).select(
        F.col("key").getField(BUCKET_COLUMN), "user_map_value.blob", "partition_id")
    return spark.createDataFrame(leaves.rdd.flatMap(decode), schema_of(key_schema, state_schema))


def stored_schemas(spark: "SparkSession", checkpoint: str | os.PathLike) -> tuple["StructType", list["StructType"]]:
    """The key schema and every state schema that stored rows were written with (meta columns
    removed; more than one after a state type changed and not every key was written since)."""
    from pyspark.sql.types import StructType

    from ..types import parse_type_tag

    op = _sparkstate_operator(spark, checkpoint)
    if op["engine"] == "batched":
        dirs = _directories(spark, checkpoint, op, None)
        key, _ = _batched_schemas(dirs)
        seen = dict.fromkeys(d.state_schema for d in dirs.values())
        return key, [StructType.fromJson(json.loads(j)) for j in seen]
    if op["layout"] == 2:
        raw = _variable(spark, checkpoint, op, STATE_VARIABLE, None)
        return raw.schema["key"].dataType, [parse_type_tag(t) for t in sorted(_tws_state_types(raw))]
    schema = _records(spark, checkpoint, None).schema
    return schema["key"].dataType, [schema["value"].dataType]


def stored_schema(spark: "SparkSession", checkpoint: str | os.PathLike) -> tuple["StructType", "StructType"]:
    """The (key, state) schemas the checkpoint's state was written with (meta columns removed;
    after a state type change, the one most keys hold)."""
    op = _sparkstate_operator(spark, checkpoint)
    if op["engine"] == "batched":
        return _batched_schemas(_directories(spark, checkpoint, op, None))
    schema = _records(spark, checkpoint, None).schema
    return schema["key"].dataType, schema["value"].dataType


def read(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None = None) -> "DataFrame":
    """Each key's state as of the latest (or ``batch_id``) committed batch.

    Columns: the key column(s), the state's fields (a primitive state: ``value``), and
    ``timeout_ms``, the pending timeout in epoch ms or null. A state field with the name of a
    key column is shown once, as the key. Works for checkpoints of every engine. Example:
    ``ss.state.read(spark, "ck/").show()`` (tests/state/test_state_tools.py runs it on real
    checkpoints).
    """
    from pyspark.sql import functions as F

    rec = _records(spark, checkpoint, batch_id)
    key_fields = rec.schema["key"].dataType.names
    value_fields = rec.schema["value"].dataType.names
    cols = [F.col(f"key.`{k}`").alias(k) for k in key_fields]
    cols += [F.col(f"value.`{v}`").alias(v) for v in value_fields if v not in key_fields]
    cols.append(F.col(INITIAL_TIMEOUT_COLUMN))
    return rec.where(F.col(EXISTS_COLUMN)).select(*cols)


def keys(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None = None) -> int:
    """The number of keys with state as of the latest (or ``batch_id``) committed batch, for every engine.

    Spark's ``numRowsTotal`` counts rows of the state store: one per key for the ``tws``
    engine, but buckets and leaves of many keys for the ``batched`` engine; this counts keys.
    A checkpoint without committed state has none.
    """
    from pyspark.sql import functions as F

    if not has_state(checkpoint):
        return 0
    return _records(spark, checkpoint, batch_id).where(F.col(EXISTS_COLUMN)).count()


def export(spark: "SparkSession", checkpoint: str | os.PathLike, path: str | os.PathLike,
           batch_id: int | None = None) -> int:
    """Write the state as Parquet at ``path`` (replaced if present); return the number of keys.

    The Parquet is accepted unchanged as ``initial_state`` of a new query.
    """
    df = read(spark, checkpoint, batch_id)
    df.write.mode("overwrite").parquet(str(path))
    return spark.read.parquet(str(path)).count()


@dataclass(frozen=True)
class PartitionStats:
    partition: int
    keys: int
    bytes_on_disk: int


@dataclass(frozen=True)
class StateStats:
    checkpoint: str
    operator: dict[str, Any]
    keys: int
    keys_with_timeout: int
    bytes_on_disk: int
    partitions: list[PartitionStats]
    committed_batches: list[int]
    keys_per_batch: dict[int, int]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def stats(spark: "SparkSession", checkpoint: str | os.PathLike, last_batches: int = 5) -> StateStats:
    """Keys and bytes per partition, keys per recent committed batch, and the operator's metadata."""
    from pyspark.sql import functions as F

    op = _sparkstate_operator(spark, checkpoint)
    raw = _records(spark, checkpoint, None).where(F.col(EXISTS_COLUMN)).cache()
    per_part = {r.partition_id: r.n for r in raw.groupBy("partition_id").agg(F.count("*").alias("n")).collect()}
    with_timeout = raw.where(F.col(INITIAL_TIMEOUT_COLUMN).isNotNull()).count()
    raw.unpersist()
    state_dir = Path(checkpoint) / "state" / str(op["operator_id"])
    parts = [PartitionStats(p, per_part.get(p, 0), _dir_bytes(state_dir / str(p))) for p in range(op["partitions"])]
    commits = sorted(int(p.name) for p in (Path(checkpoint) / "commits").glob("[0-9]*"))
    per_batch = {}
    for b in commits[-last_batches:]:
        try:
            per_batch[b] = _records(spark, checkpoint, b).where(F.col(EXISTS_COLUMN)).count()
        except Exception:  # a batch whose state files were already cleaned up
            continue
    return StateStats(
        checkpoint=str(checkpoint), operator=op, keys=sum(per_part.values()), keys_with_timeout=with_timeout,
        bytes_on_disk=_dir_bytes(state_dir), partitions=parts, committed_batches=commits, keys_per_batch=per_batch,
    )
