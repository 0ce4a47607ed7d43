"""The progress display: a live table on a terminal, periodic log lines elsewhere."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from sparkstate.observe.metrics import RunTotals, batch_metrics
from sparkstate.observe.progress import ProgressDisplay


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def feed(display: ProgressDisplay, totals: RunTotals, report: dict, role: str = "output") -> RunTotals:
    m = batch_metrics(report, role, totals.dead_letters)  # type: ignore[arg-type]
    totals = totals.add(m)
    display.update(m, totals)
    return totals


def test_not_a_terminal_log_lines_at_most_every_interval(caplog):
    clock = Clock()
    console = Console(file=io.StringIO(), force_terminal=False)
    display = ProgressDisplay(console, title="job", output_label="sessions emitted", interval_s=10, clock=clock)
    assert not display.live_mode
    t = RunTotals()
    with caplog.at_level(logging.INFO, logger="sparkstate.progress"), display:
        t = feed(display, t, {"batchId": 0, "numInputRows": 100, "processedRowsPerSecond": 50.0,
                              "stateOperators": [{"numRowsTotal": 7, "memoryUsedBytes": 3 * 1024 ** 2}],
                              "observedMetrics": {"sparkstate_output": {"rows": 4}}})
        clock.t = 5
        t = feed(display, t, {"batchId": 1, "numInputRows": 10})  # within the interval: not logged
        t = feed(display, t, {"batchId": 0, "numInputRows": 3,
                              "observedMetrics": {"sparkstate_dead_letters": {"rows": 3}}}, "dead_letters")
        clock.t = 16
        t = feed(display, t, {"batchId": 2, "numInputRows": 0, "eventTime": {"watermark": "2024-01-01T00:00:00.000Z"}})
        t = feed(display, t, {"batchId": 3, "numInputRows": 1})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "job: 1 batches | 100 rows in | in -/s, processed 50.0/s | 7 state rows (3.0 MiB) | 4 sessions emitted"
        " | 0 dead letters",
        "job: 3 batches | 110 rows in | in -/s, processed -/s | - state rows (-) | 4 sessions emitted"
        " | 3 dead letters | watermark 2024-01-01T00:00:00.000Z",
        "job: 4 batches | 111 rows in | in -/s, processed -/s | - state rows (-) | 4 sessions emitted"
        " | 3 dead letters | watermark 2024-01-01T00:00:00.000Z",  # the last one, when it closes
    ]
    assert console.file.getvalue() == ""  # nothing drawn on a non-terminal


def test_terminal_live_table():
    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with ProgressDisplay(console, title="sparkstate run sessionize", output_label="sessions emitted") as display:
        assert display.live_mode
        feed(display, RunTotals(), {"batchId": 0, "numInputRows": 1234, "inputRowsPerSecond": 99.5,
                                    "observedMetrics": {"sparkstate_output": {"rows": 12, "timed_out": 5}},
                                    "stateOperators": [{"numRowsTotal": 42, "memoryUsedBytes": 2048}]})
    out = console.file.getvalue()
    for text in ("sparkstate run sessionize", "micro-batches", "1,234", "99.5 rows/s", "state rows", "42",
                 "2.0 KiB", "sessions emitted", "closed by timeout", "dead letters"):
        assert text in out, text
