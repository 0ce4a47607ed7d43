"""The inband engine: state in-band with the rows, on ``applyInPandasWithState`` (Spark 3.4+).

The input is hashed into buckets and packed before the shuffle (the batched engine's
:func:`~sparkstate.engines.batched.packing.packer`); ``applyInPandasWithState`` grouped by
bucket runs :class:`.processor.InBandProcessor` once per bucket with input or a due timeout, and
Spark keeps each bucket's state as one row of its own state store (:mod:`.layout`). A static
DataFrame runs ``applyInPandas`` per bucket (no state to keep). What it does not support is
refused in one sentence when the query is defined (:meth:`InBandEngine.refusal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from ...errors import ConfigError
from ...group_state import GroupStateTimeout
from ..base import Engine, StatePlan, StoredLayout, has_watermark
from ..batched.layout import BUCKET_COLUMN, HASH_COLUMN
from ..batched.packing import PACKED_SCHEMA, packer
from . import layout
from .layout import STATE_SCHEMA
from .processor import InBandProcessor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The state encoding Spark's applyInPandasWithState accepts.
ENCODING_KEY = "spark.sql.streaming.stateStore.encodingFormat"
#: Buckets of a new checkpoint: each touched bucket's row is rewritten whole, so more buckets
#: keep a batch that touches few keys cheap on a large state, at one Python call per bucket.
DEFAULT_BUCKETS = 256


class InBandEngine(Engine):
    """Runs a plan with ``applyInPandasWithState`` grouped by hash bucket (see module doc).

    ``buckets``: how many groups keys are hashed into (fixed for the life of a checkpoint).
    """

    name = layout.ENGINE

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        if int(buckets) < 1:
            raise ConfigError(f"inband engine: buckets must be 1 or more, got {buckets}")
        self.buckets = int(buckets)

    @staticmethod
    def refusal(df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> str | None:
        """Why this engine cannot run the query (with the way out), or None."""
        what = f"{plan.operator}: the inband engine"
        if initial_state is not None and df.isStreaming:
            return (f"{what} (applyInPandasWithState, the engine of PySpark 3.5) takes no initial_state; on PySpark"
                    " 4.0 or later use engine='batched'")
        if plan.state_ttl_ms is not None:
            return f"{what} has no state_ttl; expire state with a timeout (engine='tws' keeps Spark's TTL on 4.1+)"
        if plan.event_time_column is not None:
            return f"{what} does not carry event time to its output (event_time_column); use engine='batched' (4.0+)"
        encoding = df.sparkSession.conf.get(ENCODING_KEY, None)
        if df.isStreaming and encoding not in (None, "unsaferow"):
            return (f"{what} needs {ENCODING_KEY}=unsaferow (Spark's applyInPandasWithState refuses {encoding!r});"
                    " set it before the query starts")
        return None

    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        from pyspark.sql import functions as F

        refusal = self.refusal(df, plan, initial_state)
        if refusal is not None:
            raise ConfigError(refusal)
        clash = [c for c in df.columns if c in (BUCKET_COLUMN, HASH_COLUMN)]
        if clash:
            raise ConfigError(f"{plan.operator}: the input has reserved column(s) {', '.join(clash)}; rename them")
        h = F.xxhash64(*[F.col(c) for c in plan.key_columns])
        bucket = F.pmod(h, F.lit(self.buckets)).cast("int").alias(BUCKET_COLUMN)
        if df.isStreaming and has_watermark(df):
            # An event-time input goes in row by row: Spark drops late rows by the column that
            # carries the watermark, and applyInPandasWithState (Spark 3.5) needs that column in
            # its own input for event-time timeouts, even the always-null one of sessionize
            # late="emit" (which drops nothing): packed rows would hide it.
            values = [F.col(f"`{f.name}`").cast("string").alias(f.name) if isinstance(f.dataType, LongType)
                      else F.col(f"`{f.name}`") for f in df.schema.fields]
            data = df.select(*values, h.alias(HASH_COLUMN), bucket)
            schema = StructType(df.schema.fields + [StructField(HASH_COLUMN, LongType(), True),
                                                    StructField(BUCKET_COLUMN, IntegerType(), True)])
            tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
            processor = InBandProcessor(plan, self.buckets, 1, schema, packed=False, tz=tz)
        else:
            cols = [F.col(f"`{c}`") for c in df.columns]
            data = df.select(*cols, h.alias(HASH_COLUMN), bucket).mapInArrow(packer(len(cols) + 1), PACKED_SCHEMA)
            schema = StructType(df.schema.fields + [StructField(HASH_COLUMN, LongType(), True)])
            processor = InBandProcessor(plan, self.buckets, 1, schema)
        if not df.isStreaming:
            def once(frame: Any) -> Any:
                return processor.static(frame)

            return data.groupBy(BUCKET_COLUMN).applyInPandas(once, plan.output_schema)

        def run(key: Any, frames: Any, state: Any) -> Any:
            return processor(key, frames, state)

        timeout = GroupStateTimeout(plan.timeout).value if plan.streaming else GroupStateTimeout.NoTimeout.value
        return data.groupBy(BUCKET_COLUMN).applyInPandasWithState(
            run, plan.output_schema, STATE_SCHEMA, "Append" if plan.output_mode == "append" else "Update", timeout)

    def stored_layout(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
        return layout.stored_layout(spark, checkpoint, operator)
