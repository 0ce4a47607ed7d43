"""Initial state on the inband engine: ``applyInPandasWithState`` (PySpark 3.5) takes none, so
the initial state travels to the buckets as rows of the operator's own input.

When the query is defined, the initial state is hashed into the query's buckets (as its input
is) and packed into one seed per bucket (:func:`seed_frame`): a pickle of the bucket's entries,
``{key: [state columns, timeout_ms, key hash]}``, every bucket included (empty for a bucket
without initial keys). No row is collected on the driver: the seeds are built on the executors.

- A static query unions the seeds with its (bucketed) input.
- A streaming query cannot union a static DataFrame, so the seeds are written once as Parquet
  (:func:`stage`) and read back by a file stream unioned with the input (:func:`with_seeds`): Spark
  reads those files in the query's first micro-batch and never again (its file source records the
  files it read in the checkpoint), so every bucket is called in the first batch, and only then.

The seed column comes last, null in the input's rows; the processor takes the seed rows out
before it reads the input (:func:`split_seeds`) and applies a bucket's seed only to a bucket with
no stored row; a seeded query keeps each bucket's row, empty or not, so that a bucket is never
seeded twice (a restart that passes the initial state again: Spark ignores it on a restart).
"""

from __future__ import annotations

import atexit
import pickle
import shutil
import tempfile
import uuid
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

from ... import fs
from ...errors import ConfigError, StateSchemaError, explain
from ..base import PICKLE_PROTOCOL, StatePlan
from ..batched.layout import BUCKET_COLUMN
from ..batched.initial import InitialEntries, hashed
from ..rules import initial_timeout

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The seed column of the operator's input (null in the input's own rows).
SEED_COLUMN = "_sparkstate_seed"
SEED_SCHEMA = StructType([StructField(BUCKET_COLUMN, IntegerType(), True), StructField(SEED_COLUMN, BinaryType(), True)])
#: Where a streaming query's seeds are written: this directory of its checkpoint (``checkpoint=``),
#: else a new directory named so under the machine's temporary directory (local mode; removed when
#: the Python process exits, see :func:`remove_staged`) or under
#: ``spark.sql.streaming.checkpointLocation``. Spark's progress names the seed source by it.
SEED_DIR = "sparkstate-initial-state"
_EMPTY = pickle.dumps({}, PICKLE_PROTOCOL)
#: The seed directories this process made under the machine's temporary directory.
_STAGED: list[str] = []


def seed_frame(initial: "DataFrame", plan: StatePlan, buckets: int) -> "DataFrame":
    """The seeds of ``initial`` (the engine's initial-state layout, see
    :meth:`~sparkstate.engines.base.Engine.apply`): one row ``(bucket, seed)`` for each of the
    ``buckets``, built on the executors (the keys hashed like the input's). A key given twice
    fails the job that builds them (:class:`ConfigError`), as Spark refuses duplicate keys."""
    from pyspark.sql import functions as F

    spark = initial.sparkSession
    rows = hashed(initial, plan, buckets)
    try:
        parts = max(1, min(buckets, int(spark.conf.get("spark.sql.shuffle.partitions") or 1)))
    except (TypeError, ValueError):
        parts = 1
    built = rows.repartition(parts, BUCKET_COLUMN).mapInArrow(_builder(plan), SEED_SCHEMA)
    every = spark.range(buckets).select(F.col("id").cast("int").alias(BUCKET_COLUMN))
    return (every.join(built, BUCKET_COLUMN, "left")
            .select(BUCKET_COLUMN, F.coalesce(F.col(SEED_COLUMN), F.lit(_EMPTY)).alias(SEED_COLUMN)))


def _builder(plan: StatePlan) -> Any:
    """The ``mapInArrow`` function packing a partition's initial rows (whole buckets) into seeds."""
    initial = InitialEntries(plan)

    def build(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        seeds: dict = {}
        for batch in batches:
            for bucket, k, entry in initial.rows(batch.to_pylist()):
                initial.add(seeds.setdefault(bucket, {}), k, entry)
        if seeds:
            yield pa.RecordBatch.from_arrays(
                [pa.array(list(seeds), pa.int32()),
                 pa.array([pickle.dumps(e, PICKLE_PROTOCOL) for e in seeds.values()], pa.binary())],
                names=[BUCKET_COLUMN, SEED_COLUMN])

    return build


def has_run(spark: "SparkSession", checkpoint: str) -> bool:
    """Whether a query ran on ``checkpoint`` (Spark planned a micro-batch there)."""
    return bool(fs.list_names(fs.join(checkpoint, "offsets"), spark))


def stage(seeds: "DataFrame", checkpoint: str | None) -> str:
    """Write a streaming query's seeds as Parquet (by the executors) where its file stream reads
    them (:data:`SEED_DIR`), and return that directory."""
    spark = seeds.sparkSession
    if checkpoint is not None:
        path = fs.join(checkpoint, SEED_DIR)
    else:
        master = str(_conf(spark, "spark.master") or "")
        root = _conf(spark, "spark.sql.streaming.checkpointLocation")
        if root:
            path = fs.join(root, f"{SEED_DIR}-{uuid.uuid4().hex}")
        elif master.startswith("local"):
            path = tempfile.mkdtemp(prefix=f"{SEED_DIR}-")
            if not _STAGED:
                atexit.register(remove_staged)
            _STAGED.append(path)
        else:
            raise ConfigError(
                "initial_state on the inband engine is staged as files the query reads in its first batch: pass the"
                " operator checkpoint= (the query's checkpoint; the files go beside its state), or set"
                " spark.sql.streaming.checkpointLocation")
    try:
        seeds.write.mode("overwrite").parquet(path)
    except Exception as exc:  # a refusal of the builder (a duplicate key, a value that cannot be stored)
        raise _ours(exc) from None
    return path


def remove_staged() -> None:
    """Remove the seed directories this process staged under the machine's temporary directory.
    Run when the process exits: a query without a checkpoint of its own reads its seeds in its
    first batch, and no query outlives the driver that started it (a restart on the same
    checkpoint, given the initial state again, stages new seeds)."""
    while _STAGED:
        shutil.rmtree(_STAGED.pop(), ignore_errors=True)


def _ours(exc: Exception) -> Exception:
    """The sparkstate error a failed Spark job carries from its Python worker, else ``exc``."""
    name, _, message = explain(exc).partition(": ")
    for cls in (ConfigError, StateSchemaError):
        if name == cls.__name__:
            return cls(message)
    return exc


def _conf(spark: "SparkSession", name: str) -> str | None:
    try:
        return spark.conf.get(name, None)
    except Exception:  # a Connect server may refuse to show a setting
        return None


def with_seeds(data: "DataFrame", seeds: "DataFrame | str | None") -> "DataFrame":
    """``data`` (the bucketed input) with :data:`SEED_COLUMN` appended (null), and the seed rows
    of ``seeds`` (a static DataFrame of :data:`SEED_SCHEMA`, or the directory a streaming query's
    seeds were staged in) unioned: null in every other column but the bucket."""
    from pyspark.sql import functions as F

    source = seeds
    if isinstance(seeds, str):
        # Through a Python step, which Spark's optimizer does not see through: in a batch without
        # seeds (every batch but the first), Spark 3.5 would prune the empty branch from the
        # union, and then report no input rows for any source (its plan's leaves no longer match).
        source = data.sparkSession.readStream.schema(SEED_SCHEMA).parquet(seeds).mapInArrow(_as_read, SEED_SCHEMA)
    out = data.select(*[F.col(f"`{c}`") for c in data.columns], F.lit(None).cast(BinaryType()).alias(SEED_COLUMN))
    if source is None:
        return out
    assert not isinstance(source, str)
    filler = [F.col(BUCKET_COLUMN) if f.name == BUCKET_COLUMN else F.lit(None).cast(f.dataType).alias(f.name)
              for f in data.schema.fields]
    return out.union(source.select(*filler, F.col(SEED_COLUMN)))


def _as_read(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def split_seeds(frames: Iterator[Any]) -> tuple[list, list]:
    """A bucket's input frames (pandas, :data:`SEED_COLUMN` last) -> (the input's own rows, the seeds)."""
    rows: list = []
    seeds: list = []
    for pdf in frames:
        seed = pdf.iloc[:, -1]
        marked = seed.notna()
        if marked.any():
            seeds += [s for s in seed[marked].tolist()]
            pdf = pdf[~marked]
        if len(pdf):
            rows.append(pdf)
    return rows, seeds


def seed_entries(seeds: list, plan: StatePlan, processing_time_ms: int) -> dict:
    """A bucket's entries from its seed(s), with the initial idle timeout of ``map_with_state``
    (``StateSpec.timeout``) counted from the first batch's ``processing_time_ms``."""
    entries: dict = {}
    for blob in seeds:
        entries.update(pickle.loads(blob))
    idle = plan.initial_idle_timeout_ms
    if idle is not None:
        for e in entries.values():
            e[1] = initial_timeout(plan.timeout, e[1], idle, processing_time_ms)
    return entries
