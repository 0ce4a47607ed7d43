"""The batched engine: many keys per Python call, no per-key round trip to the JVM.

The input is hashed into buckets and packed before the shuffle (:func:`.packing.packer`);
``transformWithStateInPandas`` grouped by bucket runs :mod:`.processor` once per bucket with
input or a due timer; state is kept in the layout of :mod:`.layout`.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from ...errors import ConfigError, StateSchemaError
from ...group_state import initial_timeout
from ..call_context import operator_options
from ..base import (INITIAL_TIMEOUT_COLUMN, PICKLE_PROTOCOL, Engine, StatePlan, StoredLayout, has_watermark,
                    initial_key_column)
from . import layout
from .layout import BUCKET_COLUMN, HASH_COLUMN, build_leaves
from .packing import BLOB_COLUMN, PACKED_SCHEMA, packer
from .processor import BucketProcessor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

LEAF_COLUMN = "_sparkstate_leaf"


def initial_leaves(initial: "DataFrame", plan: StatePlan, buckets: int, leaf_rows: int) -> "DataFrame":
    """Group an initial-state DataFrame (engine layout) into whole leaves, one row per leaf."""
    from pyspark.sql import functions as F

    n_keys = len(plan.key_columns)
    key_cols = [initial_key_column(i) for i in range(n_keys)]
    h = F.xxhash64(*[F.col(c) for c in key_cols])
    with_hash = initial.select("*", F.pmod(h, F.lit(buckets)).cast("int").alias(BUCKET_COLUMN), h.alias(HASH_COLUMN))
    fields = list(plan.state_codec.fields)
    has_timeout = plan.initial_has_timeout
    conf = plan.timeout
    operator = plan.operator
    single = n_keys == 1

    def build(table: Any) -> Any:
        import pyarrow as pa

        codec = plan.state_codec  # the plan, not the codec, is captured: it reaches the worker guarded
        rows = table.to_pylist()
        entries: dict = {}
        bucket = None
        for r in rows:
            bucket = r[BUCKET_COLUMN]
            k = r[key_cols[0]] if single else tuple(r[c] for c in key_cols)
            value = codec.decode_columns(tuple(r[f] for f in fields))
            try:
                cols = codec.encode_columns(value)
            except Exception as exc:
                raise StateSchemaError(f"{operator}: the initial state of key {k!r} cannot be stored: {exc}") from None
            t = initial_timeout(conf, r.get(INITIAL_TIMEOUT_COLUMN) if has_timeout else None, None, 0)
            entries[k] = [cols, t, r[HASH_COLUMN]]
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

    ``buckets``: how many groups keys are hashed into (fixed for the life of a checkpoint);
    ``leaf_rows``: the most keys a leaf holds before it splits; ``pack``: cut the input into
    per-bucket Arrow blobs before the shuffle (faster batches, one more Python worker per core
    for the packing step; an input with an event-time watermark column is never packed).
    """

    name = layout.ENGINE
    #: the StatefulProcessor run per bucket (``map_batches_with_state`` runs its own, same layout)
    processor_class: type = BucketProcessor

    def __init__(self, buckets: int = 64, leaf_rows: int = 64, pack: bool = True) -> None:
        if int(buckets) < 1 or int(leaf_rows) < 1:
            raise ConfigError(f"batched engine: buckets and leaf_rows must be 1 or more, got {buckets}, {leaf_rows}")
        self.buckets = int(buckets)
        self.leaf_rows = int(leaf_rows)
        self.pack = bool(pack)

    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        from pyspark.sql import functions as F

        if plan.state_ttl_ms is not None:
            raise ConfigError(
                f"{plan.operator}: state_ttl is not supported by the batched engine (it relies on Spark's per-key"
                " value-state TTL). Pass engine='tws', or expire state with a timeout."
            )
        clash = [c for c in df.columns if c in (BUCKET_COLUMN, HASH_COLUMN)]
        if clash:
            raise ConfigError(f"{plan.operator}: the input has reserved column(s) {', '.join(clash)}; rename them")
        h = F.xxhash64(*[F.col(c) for c in plan.key_columns])
        bucket = F.pmod(h, F.lit(self.buckets)).cast("int").alias(BUCKET_COLUMN)
        if not self.pack or (df.isStreaming and has_watermark(df)):
            # Spark drops input rows behind the watermark inside the stateful operator, by the
            # column that carries it; packed rows would hide that column. So an event-time
            # input goes in row by row (pandas), and Spark's late-row rule stays exactly its own.
            # (Likewise with pack=False.)
            # longs travel as strings: pandas would turn a long column with a null into float64
            values = [F.col(f"`{f.name}`").cast("string").alias(f.name) if isinstance(f.dataType, LongType)
                      else F.col(f"`{f.name}`") for f in df.schema.fields]
            data = df.select(*values, h.alias(HASH_COLUMN), bucket)
            schema = StructType(df.schema.fields + [StructField(HASH_COLUMN, LongType(), True),
                                                    StructField(BUCKET_COLUMN, IntegerType(), True)])
            tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
            processor = self.processor_class(plan, self.buckets, self.leaf_rows, schema, packed=False, tz=tz)
        else:
            cols = [F.col(f"`{c}`") for c in df.columns]
            data = df.select(*cols, h.alias(HASH_COLUMN), bucket).mapInArrow(packer(len(cols) + 1), PACKED_SCHEMA)
            schema = StructType(df.schema.fields + [StructField(HASH_COLUMN, LongType(), True)])
            processor = self.processor_class(plan, self.buckets, self.leaf_rows, schema)
        init = None
        if initial_state is not None:
            init = initial_leaves(initial_state, plan, self.buckets, self.leaf_rows).groupBy(BUCKET_COLUMN)
        return data.groupBy(BUCKET_COLUMN).transformWithStateInPandas(
            statefulProcessor=processor,
            **operator_options(plan, init),
        )

    def stored_layout(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
        return layout.stored_layout(spark, checkpoint, operator)
