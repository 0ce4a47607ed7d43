"""The inband engine: state in-band with the rows, on ``applyInPandasWithState`` (Spark 3.4+).

The input is hashed into buckets and packed before the shuffle (the batched engine's
:func:`~sparkstate.engines.batched.packing.packer`); ``applyInPandasWithState`` grouped by
bucket runs :class:`.processor.InBandProcessor` once per bucket with input or a due timeout, and
Spark keeps each bucket's state as one row of its own state store (:mod:`.layout`). A static
DataFrame runs ``applyInPandas`` per bucket (no state to keep). An initial state reaches each
bucket as a seed row of its input in the query's first batch (:mod:`.seeds`). What it does not
support is refused in one sentence when the query is defined (:meth:`InBandEngine.refusal`).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from ... import fs
from ...errors import ConfigError
from ...group_state import GroupStateTimeout
from ..base import Engine, StatePlan, StoredLayout, has_watermark
from ..batched.layout import BUCKET_COLUMN
from ..batched.packing import bucketed_input
from . import layout, seeds
from .layout import STATE_SCHEMA
from .processor import InBandLogicProcessor, InBandProcessor

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
    #: The query's checkpoint when the operator was given ``checkpoint=`` (:meth:`for_checkpoint`):
    #: a streaming initial state is staged there (:func:`.seeds.stage`).
    checkpoint: str | None = None

    def __init__(self, buckets: int = DEFAULT_BUCKETS) -> None:
        if int(buckets) < 1:
            raise ConfigError(f"inband engine: buckets must be 1 or more, got {buckets}")
        self.buckets = int(buckets)

    def for_checkpoint(self, spark: "SparkSession", stored: StoredLayout | None, checkpoint: str) -> "InBandEngine":
        other = copy.copy(self)
        other.checkpoint = checkpoint
        return other

    @staticmethod
    def refusal(df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> str | None:
        """Why this engine cannot run the query (with the way out), or None."""
        what = f"{plan.operator}: the inband engine"
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

        refusal = self.refusal(df, plan, initial_state)
        if refusal is not None:
            raise ConfigError(refusal)
        # An event-time input goes in row by row: Spark drops late rows by the column that carries
        # the watermark, and applyInPandasWithState (Spark 3.5) needs that column in its own input
        # for event-time timeouts, even the always-null one of sessionize late="emit" (which drops
        # nothing): packed rows would hide it.
        inp = bucketed_input(df, plan, self.buckets, row_by_row=df.isStreaming and has_watermark(df))
        # a plan's bucket logic runs over each bucket at once (a static DataFrame: its function per key)
        processor_class = InBandLogicProcessor if plan.bucket_logic is not None and df.isStreaming else InBandProcessor
        processor = processor_class(plan, self.buckets, 1, inp.schema, packed=inp.packed, tz=inp.tz)
        data = inp.data
        seeded = self._seeds(df, plan, initial_state)
        if seeded is not None:
            processor.seeded = True
            data = seeds.with_seeds(data, seeded)
        if not df.isStreaming:
            def once(frame: Any) -> Any:
                return processor.static(frame)

            return data.groupBy(BUCKET_COLUMN).applyInPandas(once, plan.output_schema)

        def run(key: Any, frames: Any, state: Any) -> Any:
            return processor(key, frames, state)

        timeout = GroupStateTimeout(plan.timeout).value if plan.streaming else GroupStateTimeout.NoTimeout.value
        return data.groupBy(BUCKET_COLUMN).applyInPandasWithState(
            run, plan.output_schema, STATE_SCHEMA, "Append" if plan.output_mode == "append" else "Update", timeout)

    def _seeds(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame | str | None":
        """The seeds of the query's initial state (:mod:`.seeds`): a static DataFrame for a static
        query; for a stream, the directory they are staged in. A checkpoint that a query already ran
        on gets none (Spark ignores an initial state on a restart), but keeps reading its seed
        directory when it has one, whether ``initial_state`` is given or not: Spark restarts a
        query only with the sources its checkpoint has."""
        ck = self.checkpoint
        if df.isStreaming and ck is not None and seeds.has_run(df.sparkSession, ck):
            staged = fs.join(ck, seeds.SEED_DIR)
            return staged if fs.exists(staged, df.sparkSession) else None
        if initial_state is None:
            return None
        frame = seeds.seed_frame(initial_state, plan, self.buckets)
        return seeds.stage(frame, ck) if df.isStreaming else frame

    def stored_layout(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
        return layout.stored_layout(spark, checkpoint, operator)
