"""What both engines do around one call of the user's function: clocks, the state handle,
and the encoding of state and outputs with messages that name the key.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import StateTypeError
from ..group_state import GroupState, GroupStateTimeout
from .base import StatePlan


def time_mode(plan: StatePlan) -> str:
    """The transformWithState time mode a plan needs."""
    if not plan.streaming:
        return "None"
    if plan.timeout is GroupStateTimeout.EventTimeTimeout:
        return "EventTime"
    if plan.timeout is GroupStateTimeout.ProcessingTimeTimeout or plan.state_ttl_ms is not None:
        return "ProcessingTime"
    return "None"


def operator_options(plan: StatePlan, initial_state: Any) -> dict[str, Any]:
    """The arguments of PySpark's transformWithState(InPandas) that both engines derive alike
    from the plan (the grouped initial state, or None, passed through)."""
    return {
        "outputStructType": plan.output_schema,
        "outputMode": "Append" if plan.output_mode == "append" else "Update",
        "timeMode": time_mode(plan),
        "initialState": initial_state,
        "eventTimeColumnName": plan.event_time_column or "",
    }


def wall_clock_ms() -> int:
    # The one place the engines read the wall clock: only when Spark gives no processing time
    # (a query without a time mode, or a static DataFrame).
    return int(time.time() * 1000)


class Calls:
    """Per-task helpers shared by the engines' StatefulProcessors."""

    plan: StatePlan
    mode: str
    fallback_now_ms: int

    def start_task(self, plan: StatePlan) -> None:
        self.codec = plan.state_codec
        self.n_state = len(plan.state_codec.fields)
        self.empty_cols = (None,) * self.n_state
        self.encode_output = plan.output_encoder
        self.decode_value = plan.value_decoder
        # init runs once per task (partition and batch): every key of the task sees one time.
        self.fallback_now_ms = wall_clock_ms()

    def times(self, tv: Any) -> tuple[int, int]:
        """(processing time, watermark) of this batch, in epoch ms."""
        pt = tv.getCurrentProcessingTimeInMs()
        if pt is None or pt < 0:
            pt = self.fallback_now_ms
        return pt, tv.getCurrentWatermarkInMs()

    def now(self, pt: int, wm: int) -> int:
        """The clock timeouts are compared with."""
        return wm if self.mode == "EventTime" else pt

    def group_state(self, value: Any, exists: bool, pt: int, wm: int, timed_out: bool) -> GroupState:
        has_wm = self.plan.has_watermark
        return GroupState(
            self.plan.timeout, value=value, exists=exists, has_timed_out=timed_out,
            batch_time_ms=pt, watermark_ms=max(wm, 0) if has_wm else -1, has_watermark=has_wm,
        )

    def encode_state(self, key: Any, value: Any) -> tuple:
        try:
            return self.codec.encode_columns(value)
        except StateTypeError as exc:
            raise StateTypeError(f"{self.plan.operator}: the state of key {key!r} cannot be stored: {exc}") from None

    def encode_outputs(self, key: Any, outputs: list) -> list:
        enc = self.encode_output
        try:
            return [enc(o) for o in outputs]
        except StateTypeError as exc:
            raise StateTypeError(
                f"{self.plan.operator}: an output for key {key!r} does not match output_type: {exc}"
            ) from None
