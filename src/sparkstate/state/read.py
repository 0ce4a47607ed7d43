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

from ..engines.base import EXISTS_COLUMN, INITIAL_TIMEOUT_COLUMN, STATE_VARIABLE, TIMEOUT_COLUMN
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


def _sparkstate_operator(spark: "SparkSession", checkpoint: str | os.PathLike) -> dict[str, Any]:
    if not Path(checkpoint).exists():
        raise StateSchemaError(f"checkpoint {checkpoint} does not exist")
    if not has_state(checkpoint):
        raise StateSchemaError(f"checkpoint {checkpoint} has no committed state yet (no batch has completed)")
    ops = operators(spark, checkpoint)
    ours = [o for o in ops if STATE_VARIABLE in o["state_variables"]]
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


def _raw(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None) -> "DataFrame":
    op = _sparkstate_operator(spark, checkpoint)
    reader = (spark.read.format("statestore").option("stateVarName", STATE_VARIABLE)
              .option("operatorId", op["operator_id"]))
    if batch_id is not None:
        reader = reader.option("batchId", batch_id)
    return reader.load(_path(checkpoint))


def stored_schema(spark: "SparkSession", checkpoint: str | os.PathLike) -> tuple["StructType", "StructType"]:
    """The (key, state) schemas the checkpoint's state was written with (meta columns removed)."""
    from pyspark.sql.types import StructType

    schema = _raw(spark, checkpoint, None).schema
    key = schema["key"].dataType
    value = schema["value"].dataType
    state = StructType([f for f in value.fields if f.name not in (EXISTS_COLUMN, TIMEOUT_COLUMN)])
    return key, state


def read(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None = None) -> "DataFrame":
    """Each key's state as of the latest (or ``batch_id``) committed batch.

    Columns: the key column(s), the state's fields (a primitive state: ``value``), and
    ``timeout_ms``, the pending timeout in epoch ms or null. A state field with the name of a
    key column is shown once, as the key. Example: ``ss.state.read(spark, "ck/").show()``
    (tests/state/test_state_tools.py runs it on real checkpoints).
    """
    from pyspark.sql import functions as F

    raw = _raw(spark, checkpoint, batch_id)
    key_fields = raw.schema["key"].dataType.names
    value_fields = [f for f in raw.schema["value"].dataType.names if f not in (EXISTS_COLUMN, TIMEOUT_COLUMN)]
    cols = [F.col(f"key.`{k}`").alias(k) for k in key_fields]
    cols += [F.col(f"value.`{v}`").alias(v) for v in value_fields if v not in key_fields]
    cols.append(F.col(f"value.`{TIMEOUT_COLUMN}`").alias(INITIAL_TIMEOUT_COLUMN))
    return raw.where(F.col(f"value.`{EXISTS_COLUMN}`")).select(*cols)


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
    raw = _raw(spark, checkpoint, None).where(F.col(f"value.`{EXISTS_COLUMN}`"))
    per_part = {r.partition_id: r.n for r in raw.groupBy("partition_id").agg(F.count("*").alias("n")).collect()}
    with_timeout = raw.where(F.col(f"value.`{TIMEOUT_COLUMN}`").isNotNull()).count()
    state_dir = Path(checkpoint) / "state" / str(op["operator_id"])
    parts = [PartitionStats(p, per_part.get(p, 0), _dir_bytes(state_dir / str(p))) for p in range(op["partitions"])]
    commits = sorted(int(p.name) for p in (Path(checkpoint) / "commits").glob("[0-9]*"))
    per_batch = {}
    for b in commits[-last_batches:]:
        try:
            per_batch[b] = _raw(spark, checkpoint, b).where(F.col(f"value.`{EXISTS_COLUMN}`")).count()
        except Exception:  # a batch whose state files were already cleaned up
            continue
    return StateStats(
        checkpoint=str(checkpoint), operator=op, keys=sum(per_part.values()), keys_with_timeout=with_timeout,
        bytes_on_disk=_dir_bytes(state_dir), partitions=parts, committed_batches=commits, keys_per_batch=per_batch,
    )
