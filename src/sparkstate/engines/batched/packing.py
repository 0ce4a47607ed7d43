"""The packing step before the batched engine's shuffle: a partition's rows cut by bucket into
Arrow IPC blobs (:func:`packer`, run with ``mapInArrow``), so transformWithStateInPandas is fed
a few rows per bucket instead of one per event. :class:`.grouping.Grouper` opens them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.types import BinaryType, IntegerType, LongType, StructField, StructType

from ...errors import ConfigError
from ..base import StatePlan
from .layout import BUCKET_COLUMN, HASH_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

BLOB_COLUMN = "_sparkstate_blob"

PACKED_SCHEMA = StructType([StructField(BUCKET_COLUMN, IntegerType(), True),
                            StructField(BLOB_COLUMN, BinaryType(), True)])
_PACK_ROWS = 1 << 16
_PACK_BYTES = 1 << 28  # a blob column's offsets are 32-bit: stay far below 2 GiB


@dataclass(frozen=True)
class BucketedInput:
    """An engine's input with each row's key hash and bucket, ready to be grouped by bucket.

    ``data``: packed (``(bucket, blob)`` rows, see :func:`packer`) or row by row (the input's
    columns, longs as strings, then the hash and the bucket); ``schema``: the columns a
    processor reads in the rows it is handed; ``packed`` and ``tz`` (the session time zone
    PySpark converts timestamps with, row by row only) go to the processor.
    """

    data: "DataFrame"
    schema: StructType
    packed: bool
    tz: str = "UTC"


def bucketed_input(df: "DataFrame", plan: StatePlan, buckets: int, *, row_by_row: bool,
                   every_bucket: bool = False) -> BucketedInput:
    """``df`` with each row's key hash (``xxhash64`` of the key columns) and bucket (the hash mod
    ``buckets``), packed by bucket before the shuffle unless ``row_by_row``: an input whose
    watermark column Spark must see goes in row by row, since packed rows would hide it.
    ``every_bucket`` (packed only): a partition with rows also sends an empty blob for every
    bucket, so that every bucket is called in a micro-batch with input (:func:`packer`)."""
    from pyspark.sql import functions as F

    clash = [c for c in df.columns if c in (BUCKET_COLUMN, HASH_COLUMN)]
    if clash:
        raise ConfigError(f"{plan.operator}: the input has reserved column(s) {', '.join(clash)}; rename them")
    h = F.xxhash64(*[F.col(c) for c in plan.key_columns])
    bucket = F.pmod(h, F.lit(buckets)).cast("int").alias(BUCKET_COLUMN)
    if row_by_row:
        # longs travel as strings: pandas would turn a long column with a null into float64
        values = [F.col(f"`{f.name}`").cast("string").alias(f.name) if isinstance(f.dataType, LongType)
                  else F.col(f"`{f.name}`") for f in df.schema.fields]
        schema = StructType(df.schema.fields + [StructField(HASH_COLUMN, LongType(), True),
                                                StructField(BUCKET_COLUMN, IntegerType(), True)])
        tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        return BucketedInput(df.select(*values, h.alias(HASH_COLUMN), bucket), schema, packed=False, tz=tz)
    cols = [F.col(f"`{c}`") for c in df.columns]
    data = df.select(*cols, h.alias(HASH_COLUMN), bucket).mapInArrow(
        packer(len(cols) + 1, buckets if every_bucket else None), PACKED_SCHEMA)
    return BucketedInput(data, StructType(df.schema.fields + [StructField(HASH_COLUMN, LongType(), True)]), packed=True)


def packer(bucket_pos: int, every_bucket: int | None = None) -> Any:
    """The ``mapInArrow`` function run before the shuffle: it cuts each partition's rows by
    bucket into Arrow IPC blobs, one row ``(bucket, blob)`` per bucket and up to 64K input rows
    (or 256 MB).

    ``every_bucket``: the bucket count of a plan that calls every key in each micro-batch with
    input (``StatePlan.every_key``): a partition with rows then also yields an empty blob for
    each of the buckets, so Spark calls every bucket, even one whose keys have no new rows.

    PySpark feeds transformWithStateInPandas row by row (a pandas ``itertuples`` and a
    DataFrame rebuilt per group); packed, it sees a few rows per bucket, and the Spark side
    shuffles and sorts a few rows instead of every event. The blob holds the input's columns
    and the key hash, in Spark's own Arrow types, so nothing is lost on the way.
    """

    def pack(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        def cut(chunk: list) -> Iterator[Any]:
            table = pa.Table.from_batches(chunk).combine_chunks()
            table = table.take(pc.sort_indices(table.column(bucket_pos)))
            buckets = table.column(bucket_pos).to_numpy()
            body = table.select(range(bucket_pos))
            # every bucket's slice as its own IPC stream, back to back in one buffer: the blob
            # column is that buffer with the streams' offsets (no copy per blob)
            sink = pa.BufferOutputStream()
            out_b, offsets = [], [0]
            start, n = 0, len(buckets)
            while start < n:
                b = buckets[start]
                end = int(buckets.searchsorted(b, "right"))
                with pa.ipc.new_stream(sink, body.schema) as w:
                    w.write_table(body.slice(start, end - start))
                out_b.append(int(b))
                offsets.append(sink.tell())
                start = end
                if offsets[-1] >= _PACK_BYTES or start == n:
                    blobs = pa.Array.from_buffers(
                        pa.binary(), len(out_b), [None, pa.py_buffer(np.array(offsets, np.int32)), sink.getvalue()])
                    yield pa.RecordBatch.from_arrays([pa.array(out_b, pa.int32()), blobs],
                                                     names=[BUCKET_COLUMN, BLOB_COLUMN])
                    sink, out_b, offsets = pa.BufferOutputStream(), [], [0]

        chunk: list = []
        rows = size = 0
        seen = False
        for batch in batches:
            if batch.num_rows:
                chunk.append(batch)
                rows += batch.num_rows
                size += batch.nbytes
                seen = True
            if rows >= _PACK_ROWS or size >= _PACK_BYTES:
                yield from cut(chunk)
                chunk, rows, size = [], 0, 0
        if chunk:
            yield from cut(chunk)
        if seen and every_bucket is not None:
            yield pa.RecordBatch.from_arrays(
                [pa.array(range(every_bucket), pa.int32()), pa.array([b""] * every_bucket, pa.binary())],
                names=[BUCKET_COLUMN, BLOB_COLUMN])

    return pack
