"""When each user started and last did their current activity (seed 001's ``updateStateByKey`` logic).

The state of a user is one span: an activity with the first and last time it was seen. An
event of the same activity stretches the span (earlier start, later end); an event of another
activity that is later than the span's end starts a new span; an event of another activity
that is not later than the end is ignored (an out-of-order event does not rewind the user).

Built on :func:`sparkstate.map_groups_with_state`, not on ``update_state_by_key`` as in the
seed: the seed's function only changes the state of users with new events, and
``update_state_by_key`` would visit (and emit) every user in every micro-batch to say nothing
new. ``map_groups_with_state`` calls the function once per user with events in the batch, and
emits that user's span after the batch: the same states, at the cost of the batch's users only.

Arrival order matters, by the seed's definition: its update folds the events in the order they
come, and "an event of another activity that is not later than the end is ignored" means that,
for example, ``browse@1, browse@3, buy@2`` ends in ``browse 1-3`` while the same events sorted
by time end in ``browse 3-3``. So the result depends on which micro-batch each event arrives in
(within a batch the events are applied in time order, since Spark keeps no arrival order across
the shuffle), and one row per batch shows the span after that batch. This is the seed's meaning
and is kept; it is not an event-time result (no watermark is involved).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from ..durations import instant_ms, utc
from ..errors import ConfigError
from ..group_state import GroupState, GroupStateTimeout
from ..engines import Engine
from ..operators import flat_map_groups_with_state, map_groups_with_state
from .checks import check_column, require_dataframe
from .refusals import RefusingGroups, refusal_columns, rejected_field

NAME = "first_last_activity"


@dataclass
class ActivitySpan:
    """The state of one key: its current activity, first seen at ``start``, last seen at ``end``."""

    activity: str | None
    start: datetime
    end: datetime


def apply_event(span: ActivitySpan | None, when: datetime, activity: str | None) -> ActivitySpan:
    """Seed 001's update for one event: the span after ``activity`` happened at ``when``.

    >>> from datetime import datetime, timezone
    >>> t = lambda m: datetime(2024, 1, 1, 12, m, tzinfo=timezone.utc)
    >>> s = apply_event(None, t(0), "browse")
    >>> s = apply_event(s, t(5), "browse")                  # same activity: later end
    >>> (s.activity, s.start.minute, s.end.minute)
    ('browse', 0, 5)
    >>> s = apply_event(s, t(3), "buy")                     # other activity, not later: ignored
    >>> s = apply_event(s, t(9), "buy")                     # other activity, later: a new span
    >>> (s.activity, s.start.minute, s.end.minute)
    ('buy', 9, 9)
    """
    if span is None:
        return ActivitySpan(activity, when, when)
    if activity == span.activity:
        if when > span.end:
            span.end = when
        if when < span.start:
            span.start = when
        return span
    if when > span.end:
        return ActivitySpan(activity, when, when)
    return span


class _FirstLast:
    """The group function (picklable). Values are rows ``(key, timestamp, activity)``."""

    __name__ = NAME

    def __call__(self, key: Any, rows: Iterable[Any], state: GroupState) -> tuple | None:
        # Spark does not keep arrival order across the shuffle, so a batch's events are applied
        # in event-time order (ties: by activity), which makes the result deterministic.
        events = sorted(
            ((utc(instant_ms(r[1])), r[2]) for r in rows if r[1] is not None),
            key=lambda e: (e[0], "" if e[1] is None else e[1]),
        )
        span: ActivitySpan | None = state.getOption
        for when, activity in events:
            span = apply_event(span, when, activity)
        if span is None:
            return None
        state.update(span)
        return (key, span.activity, span.start, span.end)


def first_last_activity(
    events: DataFrame, key: str = "user", timestamp: str = "timestamp", activity: str = "activity",
    engine: str | Engine | None = None, checkpoint: str | os.PathLike | None = None,
    initial_state: DataFrame | None = None, reason: str | None = None, carry: Sequence[str] = (),
) -> DataFrame:
    """Per ``key``, its current activity and when it started and was last seen (seed 001).

    Output: ``key, activity, start, end``: one row per key and micro-batch in which the key had
    events, with its span after that batch (output mode update). The rules of the span are those
    of :func:`apply_event`; a batch's events of a key are applied in ``timestamp`` order (ties by
    ``activity``), batches in arrival order. Rows with a null ``timestamp`` are left out;
    ``activity`` is compared as a string. The state of a key is kept for the life of the query
    (the seed has no timeout).

    ``checkpoint``: the query's checkpoint; when it holds state, the state is checked against
    this pipeline's before the query starts (:class:`~sparkstate.errors.StateSchemaError`).

    ``initial_state``: the state to start from on a new checkpoint, as
    :func:`sparkstate.state.export` writes it from another query's checkpoint (the key column
    and the :class:`ActivitySpan` fields ``activity``, ``start``, ``end``).

    ``reason``: a string column saying why an event was already refused (e.g. by a parser), null
    on a good one. An event with a reason changes no span: it comes out as a row of its own,
    ``activity``, ``start`` and ``end`` null, whose column ``rejected`` (null on spans) holds
    ``reason`` and the ``carry`` columns (:mod:`sparkstate.pipelines.refusals`).

    >>> import sparkstate as ss
    >>> from datetime import datetime
    >>> spark = ss.spark_session()
    >>> clicks = spark.createDataFrame([
    ...     ("ann", datetime(2024, 1, 1, 12, 0), "browse"),
    ...     ("ann", datetime(2024, 1, 1, 12, 4), "browse"),
    ...     ("ann", datetime(2024, 1, 1, 12, 7), "buy"),
    ...     ("bob", datetime(2024, 1, 1, 12, 1), "browse"),
    ... ], "user string, timestamp timestamp, activity string")
    >>> for r in first_last_activity(clicks).orderBy("user").collect():
    ...     print(r.user, r.activity, r.start.time(), r.end.time())
    ann buy 12:07:00 12:07:00
    bob browse 12:01:00 12:01:00
    """
    require_dataframe(events, NAME)
    check_column(events, key, "key", NAME)
    check_column(events, timestamp, "timestamp", NAME, (TimestampType,), "timestamp")
    check_column(events, activity, "activity", NAME)
    if len({key, timestamp, activity}) < 3:
        raise ConfigError(
            f"{NAME}: key, timestamp and activity must be three different columns, got"
            f" key={key!r}, timestamp={timestamp!r}, activity={activity!r}"
        )
    if key in ("activity", "start", "end"):
        raise ConfigError(
            f"{NAME}: the output has columns activity, start and end beside the key, so the key column"
            f" cannot be called {key!r}; rename it first, e.g. events.withColumnRenamed({key!r}, 'user')"
        )
    carry = refusal_columns(events, NAME, reason, carry, key, (timestamp, activity))
    refusal = [F.col(reason), *map(F.col, carry)] if reason is not None else []
    df = events.select(F.col(key), F.col(timestamp), F.col(activity).cast("string"), *refusal)
    output = StructType([
        StructField(key, events.schema[key].dataType, True),
        StructField("activity", StringType(), True),
        StructField("start", TimestampType(), True),
        StructField("end", TimestampType(), True),
    ])
    settings: dict[str, Any] = dict(key=key, state_type=ActivitySpan, timeout=GroupStateTimeout.NoTimeout,
                                    output_mode="update", engine=engine, checkpoint=checkpoint,
                                    initial_state=initial_state)
    if reason is None:
        return map_groups_with_state(df, func=_FirstLast(), output_type=output, **settings)
    output.add(rejected_field(events, carry))
    return flat_map_groups_with_state(df, func=RefusingGroups(_FirstLast(), 3, 4), output_type=output, **settings)

__all__ = ["ActivitySpan", "apply_event", "first_last_activity"]
