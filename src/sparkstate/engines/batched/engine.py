"""The batched engine: many keys per Python call, no per-key round trip to the JVM.

The input is hashed into buckets and packed before the shuffle (:func:`.packing.packer`);
``transformWithStateInPandas`` grouped by bucket runs :mod:`.processor` once per bucket with
input or a due timer; state is kept in the layout of :mod:`.layout`.
"""

from __future__ import annotations

import copy
import pickle
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from ...errors import ConfigError
from ..call_context import operator_options
from .initial import InitialEntries, hashed
from ..base import PICKLE_PROTOCOL, Engine, StatePlan, StoredLayout, drops_late_rows
from ..runtime import TRANSFORM_WITH_STATE_IN_PANDAS, require
from . import layout
from .layout import BUCKET_COLUMN, build_leaves
from .packing import BLOB_COLUMN, bucketed_input
from .logic import LogicProcessor
from .processor import BucketProcessor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LEAF_COLUMN = "_sparkstate_leaf"
#: A new checkpoint's buckets per state partition, at least: Spark places buckets on partitions by
#: hash, so a few per partition keep every partition's task busy (docs/performance.md, Scale-out).
BUCKETS_PER_PARTITION = 4
#: The count of every checkpoint written before counts followed the partitions.
LEGACY_BUCKETS = 64


def default_buckets(spark: "SparkSession") -> int:
    """A new checkpoint's bucket count, for its state partitions (the session's
    ``spark.sql.shuffle.partitions``, which a new checkpoint takes as its own): see :func:`buckets_for`."""
    try:
        partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    except (TypeError, ValueError):
        partitions = 200
    return buckets_for(partitions)


def buckets_for(partitions: int) -> int:
    """The fewest buckets, :data:`BUCKETS_PER_PARTITION` per partition or more, that Spark's hash
    placement spreads over every one of ``partitions`` (so N partitions give N stateful tasks).

    >>> buckets_for(2), buckets_for(6), buckets_for(200)
    (8, 24, 1403)
    """
    n = max(1, int(partitions))
    count = BUCKETS_PER_PARTITION * n
    hit = {spark_partition_of(b, n) for b in range(count)}
    while len(hit) < n:
        hit.add(spark_partition_of(count, n))
        count += 1
    return count


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def spark_partition_of(bucket: int, partitions: int) -> int:
    """The shuffle partition Spark's hash partitioning gives an int grouping key (Murmur3 x86_32 of
    the int, seed 42, as ``Murmur3Hash``; then a non-negative modulo)."""
    k = (bucket & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    k = _rotl(k, 15) * 0x1B873593 & 0xFFFFFFFF
    h = 42 ^ k
    h = (_rotl(h, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h ^= 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    h ^= h >> 16
    signed = h - (1 << 32) if h & 0x80000000 else h
    return signed % partitions


def initial_leaves(initial: "DataFrame", plan: StatePlan, buckets: int, leaf_rows: int) -> "DataFrame":
    """Group an initial-state DataFrame (engine layout) into whole leaves, one row per leaf."""
    with_hash = hashed(initial, plan, buckets)
    entries_of = InitialEntries(plan)

    def build(table: Any) -> Any:
        import pyarrow as pa

        entries: dict = {}
        bucket = None
        for b, k, entry in entries_of.rows(table.to_pylist()):
            bucket = b  # a group is one bucket
            entries_of.add(entries, k, entry)
        leaves = build_leaves(entries, leaf_rows)
        out_b, out_l, out_blob = [], [], []
        for lid, ents in leaves.items():  # empty leaves too: together they cover the bucket
            out_b.append(bucket)
            out_l.append(lid)
            out_blob.append(pickle.dumps(ents, PICKLE_PROTOCOL))
        return pa.table({BUCKET_COLUMN: pa.array(out_b, pa.int32()), LEAF_COLUMN: pa.array(out_l, pa.int64()),
                         BLOB_COLUMN: pa.array(out_blob, pa.binary())})

    schema = StructType([
        StructField(BUCKET_COLUMN, IntegerType(), True),
        StructField(LEAF_COLUMN, LongType(), True),
        StructField(BLOB_COLUMN, BinaryType(), True),
    ])
    return with_hash.groupBy(BUCKET_COLUMN).applyInArrow(build, schema)


class BatchedEngine(Engine):
    """Runs a plan with ``transformWithStateInPandas`` grouped by hash bucket (see module doc).

    ``buckets``: how many groups keys are hashed into, so how many tasks at most do the stateful
    work (fixed for the life of a checkpoint and recorded in it). ``None``: a new checkpoint gets
    :data:`BUCKETS_PER_PARTITION` per state partition (the session's ``spark.sql.shuffle.partitions``
    when the query is defined), and a query given its ``checkpoint=`` goes on with the count
    recorded there (:meth:`for_checkpoint`). ``leaf_rows``: the most keys a leaf holds before it splits; ``pack``: cut the input into
    per-bucket Arrow blobs before the shuffle (faster batches, one more Python worker per core
    for the packing step; an input with an event-time watermark column is never packed).
    """

    name = layout.ENGINE
    #: the StatefulProcessor run per bucket (``map_batches_with_state`` runs its own, same layout;
    #: a plan with a bucket logic runs :class:`.logic.LogicProcessor`)
    processor_class: type = BucketProcessor

    def __init__(self, buckets: int | None = None, leaf_rows: int = 64, pack: bool = True) -> None:
        if (buckets is not None and int(buckets) < 1) or int(leaf_rows) < 1:
            raise ConfigError(f"batched engine: buckets and leaf_rows must be 1 or more, got {buckets}, {leaf_rows}")
        self.buckets = None if buckets is None else int(buckets)
        self.leaf_rows = int(leaf_rows)
        self.pack = bool(pack)

    def for_checkpoint(self, spark: "SparkSession", stored: StoredLayout | None, checkpoint: str) -> "BatchedEngine":
        """This engine with the bucket count of the state in ``checkpoint`` (``stored``: its
        layout, ``None`` when it has no state yet: then a count from the session's partitions)."""
        if stored is None:
            return self if self.buckets is not None else self._with(default_buckets(spark))
        have = stored.settings().get("buckets")
        if have is None or have == self.buckets:
            return self
        if self.buckets is not None:
            raise ConfigError(
                f"the state in checkpoint {checkpoint} is hashed into {have} buckets and this query asks for"
                f" BatchedEngine(buckets={self.buckets}); the count is fixed for the life of a checkpoint. Leave"
                f" buckets out (the checkpoint's {have} are used), or rescale: export the state (`sparkstate state"
                " export CHECKPOINT state.parquet`) and start the query on a new checkpoint with"
                " initial_state=spark.read.parquet(\"state.parquet\") (docs/cluster.md, Rescaling)."
            )
        return self._with(have)

    def _with(self, buckets: int) -> "BatchedEngine":
        other = copy.copy(self)
        other.buckets = buckets
        return other

    def _row_by_row(self, df: "DataFrame") -> bool:
        # Spark drops input rows behind the watermark inside the stateful operator, by the column
        # that carries it; packed rows would hide that column. So an event-time input goes in row
        # by row (pandas), and Spark's late-row rule stays exactly its own (likewise with
        # pack=False). An input whose only watermark column is always null (sessionize
        # late="emit") loses no row to Spark: it is packed.
        return not self.pack or (df.isStreaming and drops_late_rows(df))

    def visits_every_key(self, df: "DataFrame") -> bool:
        """Packed input only (see :meth:`apply`): the packing step adds an empty blob for every
        bucket to a micro-batch with input, so every bucket is called and reads all its keys."""
        return self.processor_class is BucketProcessor and not self._row_by_row(df)

    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        require(TRANSFORM_WITH_STATE_IN_PANDAS, f"{plan.operator}: engine='batched' (Spark's transformWithStateInPandas)",
                "Use engine='inband' (or leave engine= out).")
        if self.buckets is None:  # no checkpoint= to read it from: as for a new checkpoint
            return self._with(default_buckets(df.sparkSession)).apply(df, plan, initial_state)
        if plan.state_ttl_ms is not None:
            raise ConfigError(
                f"{plan.operator}: state_ttl is not supported by the batched engine (it relies on Spark's per-key"
                " value-state TTL). Pass engine='tws', or expire state with a timeout."
            )
        processor_class = self.processor_class
        if processor_class is BucketProcessor and plan.bucket_logic is not None:
            processor_class = LogicProcessor  # the plan's logic over a bucket at a time, not func per key
        inp = bucketed_input(df, plan, self.buckets, row_by_row=self._row_by_row(df), every_bucket=plan.every_key)
        processor = processor_class(plan, self.buckets, self.leaf_rows, inp.schema, packed=inp.packed, tz=inp.tz)
        data = inp.data
        init = None
        if initial_state is not None:
            init = initial_leaves(initial_state, plan, self.buckets, self.leaf_rows).groupBy(BUCKET_COLUMN)
        return data.groupBy(BUCKET_COLUMN).transformWithStateInPandas(
            statefulProcessor=processor,
            **operator_options(plan, init),
        )

    def stored_layout(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
        return layout.stored_layout(spark, checkpoint, operator)
