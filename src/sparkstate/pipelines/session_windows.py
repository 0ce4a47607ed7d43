"""Sessions aggregated per time window of their end, in the same query as :func:`sessionize`.

Spark closes a window of an append-mode aggregation when the watermark passes the window's
end, but a session is final only once the watermark passes its end + gap: grouping sessions by
``window(session_end, ...)`` would close an hour before its last sessions arrive. Spark also
refuses a row from the stateful operator whose event time is not after the previous
micro-batch's watermark. So :func:`sessionize` (``event_time_column=``) carries event time on
in a column shifted a fixed offset after ``session_end`` (``gap`` + 1 ms), which no final
session is behind, and this function windows that column with the windows' start moved by the
same offset, then shifts the windows back: each session counts in the window of its
``session_end``, and each window comes out once, complete.
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..durations import Duration, positive_ms
from ..errors import ConfigError
from .checks import check_column, require_dataframe
from .sessionize import END_OFFSET_KEY


def sessions_per_window(
    sessions: DataFrame,
    window: Duration,
    *aggs: Column,
    slide: Duration | None = None,
    by: str | Sequence[str] = (),
) -> DataFrame:
    """Aggregate :func:`sessionize`'s output per time window of ``session_end`` (and ``by``).

    ``sessions`` must come from ``sessionize(..., event_time_column=NAME)``. Returns
    ``window`` (``start``, ``end``: the window of ``session_end``), the ``by`` columns and the
    ``aggs`` (default: ``count`` of sessions as ``sessions``). On a stream, run it in append
    mode: each window is written once, when the watermark has passed its end + ``gap``, with
    every session that ends in it; Spark's aggregation keeps the open windows in its own state.
    ``slide``: sliding windows (default: tumbling, ``slide = window``). Refused rows
    (``late="emit"``) have no session and are left out.

    >>> import sparkstate as ss
    >>> from datetime import datetime
    >>> clicks = ss.spark_session().createDataFrame([
    ...     ("u1", datetime(2024, 1, 1, 12, 0), "/home", False),
    ...     ("u1", datetime(2024, 1, 1, 12, 50), "/help", False),
    ...     ("u2", datetime(2024, 1, 1, 13, 10), "/cart", True),
    ... ], "user_id string, event_time timestamp, data string, is_last boolean")
    >>> sessions = ss.pipelines.sessionize(clicks, gap="1 minute", event_time_column="final_time")
    >>> for r in sessions_per_window(sessions, "1 hour").orderBy("window").collect():
    ...     print(r.window.start.time(), r.window.end.time(), r.sessions)
    12:00:00 13:00:00 2
    13:00:00 14:00:00 1
    """
    require_dataframe(sessions, "sessions_per_window", "sessions")
    marked = [f for f in sessions.schema.fields if END_OFFSET_KEY in (f.metadata or {})]
    if not marked:
        raise ConfigError("sessions_per_window: the input has no session event-time column; build it with"
                          " sessionize(..., event_time_column='final_time') (columns now: "
                          f"{', '.join(sessions.columns)})")
    column = marked[0].name
    offset_ms = int(marked[0].metadata[END_OFFSET_KEY])
    keys = [by] if isinstance(by, str) else list(by)
    for k in keys:
        check_column(sessions, k, "by", "sessions_per_window")
    try:
        window_ms = positive_ms(window, "sessions_per_window: window")
        slide_ms = window_ms if slide is None else positive_ms(slide, "sessions_per_window: slide")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if slide_ms > window_ms:
        raise ConfigError(f"sessions_per_window: slide ({slide!r}) must not be longer than window ({window!r})")
    if not aggs:
        aggs = (F.count(F.lit(1)).alias("sessions"),)
    # Windows of the shifted column start `offset` after the windows of session_end (Spark
    # takes a start offset modulo the slide), so both put a session in the same window.
    windowed = F.window(F.col(column), f"{window_ms} milliseconds", f"{slide_ms} milliseconds",
                        f"{offset_ms % slide_ms} milliseconds")
    back = F.expr(f"INTERVAL {offset_ms} MILLISECONDS")
    out = sessions.where(F.col(column).isNotNull()).groupBy(windowed, *keys).agg(*aggs)
    shifted = F.struct((F.col("window.start") - back).alias("start"), (F.col("window.end") - back).alias("end"))
    return out.select(shifted.alias("window"), *[F.col(f"`{c}`") for c in out.columns if c != "window"])


__all__ = ["sessions_per_window"]
