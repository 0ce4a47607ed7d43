"""The tws engine: PySpark's ``transformWithState`` grouped by the key columns, one Python call
per key and micro-batch (see :mod:`.processor`), state in the layout of :mod:`.layout`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..call_context import operator_options
from ..base import Engine, StatePlan, StoredLayout, initial_key_column
from ..runtime import TRANSFORM_WITH_STATE_ROWS, require
from . import layout
from .processor import KeyProcessor

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class TransformWithStateEngine(Engine):
    """Runs a plan with ``groupBy(keys).transformWithState`` (PySpark >= 4.1)."""

    name = layout.ENGINE

    def apply(self, df: "DataFrame", plan: StatePlan, initial_state: "DataFrame | None") -> "DataFrame":
        require(TRANSFORM_WITH_STATE_ROWS, f"{plan.operator}: engine='tws' (Spark's transformWithState with Rows)",
                "Use engine='batched' (or leave engine= out).")
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
