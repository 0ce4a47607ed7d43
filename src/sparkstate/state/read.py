"""Read a sparkstate query's state from its checkpoint, without running the query.

Built on Spark's ``statestore`` and ``state-metadata`` readers. The engine that wrote the
checkpoint reads its own layout back (:class:`~sparkstate.engines.base.StoredLayout`, found by
:func:`~sparkstate.engines.checkpoint.stored_layout`) in one shape for every engine: this
module knows no engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from .. import fs
from ..engines.base import EXISTS_COLUMN, INITIAL_TIMEOUT_COLUMN
from ..engines.checkpoint import has_state, operators, stored_layout
from ..paths import absolute_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["check_local", "engine_of", "export", "has_state", "keys", "operators", "read", "stats", "stored_schema", "stored_schemas"]


def check_local(checkpoint: str | os.PathLike) -> None:
    """What can be told of a local ``checkpoint`` without Spark: it exists and has committed state.

    Raises :class:`~sparkstate.errors.StateSchemaError` as :func:`read` would, but before any
    Spark starts (``sparkstate state`` calls it first); a remote URI is left to :func:`read`.

    >>> check_local("/nonexistent")
    Traceback (most recent call last):
    ...
    sparkstate.errors.StateSchemaError: checkpoint /nonexistent does not exist; give the checkpoint directory of a query (its --checkpoint or checkpointLocation)
    """
    from pathlib import Path

    from ..errors import StateSchemaError
    from ..paths import local_path

    here = local_path(absolute_path(checkpoint))
    if here is None:
        return
    if not here.exists():
        raise StateSchemaError(f"checkpoint {here} does not exist; give the checkpoint directory of a query"
                               " (its --checkpoint or checkpointLocation)")
    commits = Path(here) / "commits"
    if not (here / "state").is_dir() or not commits.is_dir() or not any(n.name.isdigit() for n in commits.iterdir()):
        raise StateSchemaError(f"checkpoint {here} has no committed state yet (no batch has completed); run the"
                               " query until it commits a batch, or give another checkpoint")


def engine_of(spark: "SparkSession", checkpoint: str | os.PathLike) -> str:
    """The registered name of the engine whose layout a checkpoint's state has."""
    return stored_layout(spark, checkpoint).engine


def _records(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None) -> "DataFrame":
    """One row per stored key, whatever the engine: ``partition_id``, the key columns (under
    ``key``), the state's fields (under ``value``), its timeout and whether state exists."""
    return stored_layout(spark, checkpoint).records(batch_id)


def stored_schemas(spark: "SparkSession", checkpoint: str | os.PathLike) -> tuple["StructType", list["StructType"]]:
    """The key schema and every state schema that stored rows were written with (meta columns
    removed; more than one after a state type changed and not every key was written since)."""
    return stored_layout(spark, checkpoint).schemas()


def stored_schema(spark: "SparkSession", checkpoint: str | os.PathLike) -> tuple["StructType", "StructType"]:
    """The (key, state) schemas the checkpoint's state was written with (meta columns removed;
    after a state type change, the one most keys hold)."""
    return stored_layout(spark, checkpoint).schema()


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
    key_fields = cast("StructType", rec.schema["key"].dataType).names
    value_fields = cast("StructType", rec.schema["value"].dataType).names
    cols = [F.col(f"key.`{k}`").alias(k) for k in key_fields]
    cols += [F.col(f"value.`{v}`").alias(v) for v in value_fields if v not in key_fields]
    cols.append(F.col(INITIAL_TIMEOUT_COLUMN))
    return rec.where(F.col(EXISTS_COLUMN)).select(*cols)


def keys(spark: "SparkSession", checkpoint: str | os.PathLike, batch_id: int | None = None) -> int:
    """The number of keys with state as of the latest (or ``batch_id``) committed batch, for every engine.

    Spark's ``numRowsTotal`` counts rows of the state store, and an engine may keep many keys
    in one row; this counts keys.
    A checkpoint without committed state has none.
    """
    from pyspark.sql import functions as F

    if not has_state(checkpoint, spark):
        return 0
    return _records(spark, checkpoint, batch_id).where(F.col(EXISTS_COLUMN)).count()


def export(spark: "SparkSession", checkpoint: str | os.PathLike, path: str | os.PathLike,
           batch_id: int | None = None) -> int:
    """Write the state as Parquet at ``path`` (replaced if present); return the number of keys.

    The Parquet is accepted unchanged as ``initial_state`` of a new query.
    """
    df = read(spark, checkpoint, batch_id)
    path = absolute_path(path)
    df.write.mode("overwrite").parquet(path)
    return spark.read.parquet(path).count()


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
    #: settings the engine's layout fixed when the checkpoint was created (batched: ``buckets``)
    layout_settings: dict[str, Any] = field(default_factory=dict)
    #: how batches read the state (:meth:`~sparkstate.engines.base.StoredLayout.reads`; the batched
    #: engine: leaves, keys per leaf, and the batch size from which a bucket is read in one scan)
    reads: dict[str, Any] = field(default_factory=dict)


def stats(spark: "SparkSession", checkpoint: str | os.PathLike, last_batches: int = 5) -> StateStats:
    """Keys and bytes per partition, keys per recent committed batch, and the operator's metadata."""
    from pyspark.sql import functions as F

    stored = stored_layout(spark, checkpoint)
    op = stored.operator
    raw = stored.records(None).where(F.col(EXISTS_COLUMN)).cache()
    per_part = {r.partition_id: r.n for r in raw.groupBy("partition_id").agg(F.count("*").alias("n")).collect()}
    with_timeout = raw.where(F.col(INITIAL_TIMEOUT_COLUMN).isNotNull()).count()
    raw.unpersist()
    root = absolute_path(checkpoint)
    state_dir = fs.join(root, "state", str(op["operator_id"]))
    parts = [PartitionStats(p, per_part.get(p, 0), fs.total_bytes(fs.join(state_dir, str(p)), spark))
             for p in range(op["partitions"])]
    commits = sorted(int(n) for n in fs.list_names(fs.join(root, "commits"), spark) if n.isdigit())
    per_batch = {}
    for b in commits[-last_batches:]:
        try:
            per_batch[b] = stored.records(b).where(F.col(EXISTS_COLUMN)).count()
        except Exception:  # a batch whose state files were already cleaned up
            continue
    return StateStats(
        checkpoint=str(checkpoint), operator=op, keys=sum(per_part.values()), keys_with_timeout=with_timeout,
        bytes_on_disk=fs.total_bytes(state_dir, spark), partitions=parts, committed_batches=commits,
        keys_per_batch=per_batch, layout_settings=stored.settings(), reads=stored.reads(),
    )
