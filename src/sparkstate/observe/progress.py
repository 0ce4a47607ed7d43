"""A live view of a running job: a ``rich`` table on a terminal, periodic log lines elsewhere.

:class:`ProgressDisplay` is fed by :class:`~sparkstate.observe.listener.MetricsListener`
(``on_batch=display.update``) and shows micro-batches, input and processing rates, keys in
state, state memory, rows (sessions) emitted and dead letters. On a terminal it redraws a
table in place; when the console is not a terminal (a pipe, a log file, CI) it writes one
``logging`` line (logger ``sparkstate.progress``, level INFO) at most every ``interval_s``
seconds, and a last one when it closes. It writes to the console it is given and never to
``sys.stdout`` by itself.

>>> from sparkstate.observe.metrics import RunTotals
>>> display = ProgressDisplay(output_label="sessions emitted")
>>> print(display.line(RunTotals(batches=3, rows_in=120, rows_out=7, state_rows=4, state_memory_bytes=2048)))
3 batches | 120 rows in | in -/s, processed -/s | 4 state rows (2.0 KiB) | 7 sessions emitted | 0 dead letters
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from .metrics import BatchMetrics, RunTotals

log = logging.getLogger("sparkstate.progress")


def human_bytes(n: int | None) -> str:
    """``n`` bytes for humans (binary units).

    >>> human_bytes(512), human_bytes(1536), human_bytes(5 * 1024 ** 3), human_bytes(None)
    ('512 B', '1.5 KiB', '5.0 GiB', '-')
    """
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _reads(t: RunTotals) -> str:
    """The last batch's state reads in words.

    >>> _reads(RunTotals(state_reads="scan", state_point_reads=553, state_bytes_scanned=741_897))
    'scan (724.5 KiB scanned, 553 rows by key)'
    >>> _reads(RunTotals(state_reads="point", state_point_reads=50, state_bytes_scanned=0))
    'key (50 rows)'
    """
    if t.state_reads == "scan":
        return f"scan ({human_bytes(t.state_bytes_scanned)} scanned, {_count(t.state_point_reads)} rows by key)"
    if t.state_reads == "point":
        return f"key ({_count(t.state_point_reads)} rows)"
    return "nothing read"


class ProgressDisplay:
    """Shows a job's :class:`~sparkstate.observe.metrics.RunTotals` as they change.

    ``console``: a ``rich.console.Console``; a live table is drawn when it is a terminal,
    else (and when ``console`` is ``None``) progress goes to log lines. ``output_label``
    names the output rows (``"sessions emitted"`` for sessionize). Use it as a context manager
    around the job, with :meth:`update` as the listener's ``on_batch``.

    >>> import io
    >>> from rich.console import Console
    >>> from sparkstate.observe.metrics import batch_metrics
    >>> console = Console(file=io.StringIO(), force_terminal=True, width=100)
    >>> with ProgressDisplay(console, title="demo") as display:
    ...     m = batch_metrics({"batchId": 0, "numInputRows": 5}, "output")
    ...     display.update(m, RunTotals().add(m))
    >>> "5" in console.file.getvalue() and "demo" in console.file.getvalue()
    True
    """

    def __init__(
        self,
        console: Any = None,
        *,
        title: str = "sparkstate",
        output_label: str = "rows emitted",
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.title = title
        self.output_label = output_label
        self.interval_s = interval_s
        self.clock = clock
        self.totals = RunTotals()
        self.live_mode = bool(console is not None and getattr(console, "is_terminal", False))
        self._live: Any = None
        self._lock = threading.Lock()
        self._started = clock()
        self._last_logged: float | None = None
        self._logged_batch: int | None = None

    # -- rendering -----------------------------------------------------------------------------
    def line(self, t: RunTotals | None = None) -> str:
        """The totals as one plain line (the log-line form)."""
        t = self.totals if t is None else t
        parts = [
            f"{t.batches:,} batches",
            f"{t.rows_in:,} rows in",
            f"in {_rate(t.input_rows_per_s)}/s, processed {_rate(t.processed_rows_per_s)}/s",
            f"{_count(t.state_rows)} state rows ({human_bytes(t.state_memory_bytes)})",
            f"{_count(t.rows_out)} {self.output_label}",
            f"{t.dead_letters:,} dead letters",
        ]
        if t.backlog is not None:
            parts.append(f"{t.backlog:,} behind")
        if t.state_reads is not None:
            parts.append(f"state read by {_reads(t)}")
        if t.watermark:
            parts.append(f"watermark {t.watermark}")
        return " | ".join(parts)

    def render(self) -> Any:
        """The totals as a ``rich`` table (the live form)."""
        from rich.table import Table

        with self._lock:
            t = self.totals
        elapsed = self.clock() - self._started
        table = Table(title=f"{self.title}  ({elapsed:,.0f} s)", show_header=False, title_justify="left")
        table.add_column("what", style="bold")
        table.add_column("value", justify="right")
        table.add_row("micro-batches", f"{t.batches:,}" + ("" if t.last_batch_id is None else f" (last #{t.last_batch_id})"))
        table.add_row("rows in", f"{t.rows_in:,}")
        if t.backlog is not None:
            table.add_row("behind (source backlog)", f"{t.backlog:,}")
        table.add_row("input rate", f"{_rate(t.input_rows_per_s)} rows/s")
        table.add_row("processing rate", f"{_rate(t.processed_rows_per_s)} rows/s")
        table.add_row("last batch", "-" if t.last_batch_ms is None else f"{t.last_batch_ms:,} ms")
        table.add_row("state rows", _count(t.state_rows))
        table.add_row("state memory", human_bytes(t.state_memory_bytes))
        if t.state_reads is not None:
            table.add_row("state reads (last batch)", _reads(t))
        table.add_row(self.output_label, _count(t.rows_out))
        if t.timed_out is not None:
            table.add_row("  closed by timeout", f"{t.timed_out:,}")
        table.add_row("dead letters", f"{t.dead_letters:,}")
        if t.watermark:
            table.add_row("watermark", t.watermark)
        return table

    # -- feeding -------------------------------------------------------------------------------
    def update(self, metrics: BatchMetrics, totals: RunTotals) -> None:
        """Take the totals after a batch (called on Spark's listener thread)."""
        with self._lock:
            self.totals = totals
        if self.live_mode:
            if self._live is not None:
                self._live.refresh()
            return
        if metrics.query != "output":  # a dead-letter batch: its count shows with the next output batch
            return
        now = self.clock()
        if self._last_logged is None or now - self._last_logged >= self.interval_s:
            self._log(now)

    def _log(self, now: float) -> None:
        with self._lock:
            t = self.totals
            self._last_logged = now
            self._logged_batch = t.last_batch_id
        log.info("%s: %s", self.title, self.line(t))

    # -- lifetime ------------------------------------------------------------------------------
    def __enter__(self) -> "ProgressDisplay":
        self._started = self.clock()
        if self.live_mode:
            from rich.live import Live

            self._live = Live(get_renderable=self.render, console=self.console, refresh_per_second=2, transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None
        elif not self.live_mode and self.totals.batches and self._logged_batch != self.totals.last_batch_id:
            self._log(self.clock())


__all__ = ["ProgressDisplay", "human_bytes"]
