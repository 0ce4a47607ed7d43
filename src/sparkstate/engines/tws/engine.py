"""The tws engine: PySpark's ``transformWithState`` grouped by the key columns, one Python call
per key and micro-batch (see :mod:`.processor`), state in the layout of :mod:`.layout`. On
PySpark 4.0, which has only ``transformWithStateInPandas``, the same processor takes its rows as
pandas frames (:mod:`.pandas_processor`): same state, same TTL, same results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..call_context import operator_options
from ..base import Engine, StatePlan, StoredLayout, initial_key_column
from ..runtime import TRANSFORM_WITH_STATE_IN_PANDAS, TRANSFORM_WITH_STATE_ROWS, has, require
from . import layout
from .pandas_processor import PandasKeyProcessor, with_long_companions
from .processor import KeyProcessor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class TransformWithStateEngine(Engine):
    """Runs a plan with ``groupBy(keys).transformWithState`` (PySpark >= 4.1), or
    ``transformWithStateInPandas`` on 4.0."""

    name = layout.ENGINE

    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        require(TRANSFORM_WITH_STATE_IN_PANDAS, f"{plan.operator}: engine='tws' (Spark's transformWithState)",
                "Use engine='inband' (or leave engine= out).")
        if not has(TRANSFORM_WITH_STATE_ROWS):
            return self._apply_pandas(df, plan, initial_state)
        grouped = df.groupBy(*plan.key_columns)
        init = None
        if initial_state is not None:
            init = initial_state.groupBy(*[initial_key_column(i) for i in range(len(plan.key_columns))])
        return grouped.transformWithState(
            statefulProcessor=KeyProcessor(plan, df.schema),
            **operator_options(plan, init),
        )

    def stored_layout(self, spark: "SparkSession", checkpoint: str, operator: dict[str, Any]) -> StoredLayout | None:
        return layout.stored_layout(spark, checkpoint, operator)

    def _apply_pandas(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        tz = df.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
        init = None
        if initial_state is not None:
            init = with_long_companions(initial_state).groupBy(
                *[initial_key_column(i) for i in range(len(plan.key_columns))])
        processor = PandasKeyProcessor(plan, df.schema, tz, None if initial_state is None else initial_state.schema)
        return with_long_companions(df).groupBy(*plan.key_columns).transformWithStateInPandas(
            statefulProcessor=processor,
            **operator_options(plan, init),
        )
