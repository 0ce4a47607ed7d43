"""first_last_activity (seed 001) on real local Spark: exact spans after every micro-batch."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from sparkstate.errors import ConfigError
from sparkstate.pipelines import first_last_activity
from sparkstate.pipelines.first_last_activity import apply_event

from ..streams import LandingDir, StreamRun

SCHEMA = "user string, timestamp timestamp, activity string"


def t(hh_mm: str) -> datetime:
    h, m = map(int, hh_mm.split(":"))
    return datetime(2024, 1, 1, h, m, tzinfo=timezone.utc)


def ev(user: str, when: str | None, activity: str) -> dict:
    return {"user": user, "timestamp": None if when is None else t(when).isoformat(), "activity": activity}


def spans(rows) -> list[tuple]:
    """Rows as (user, activity, start, end) with aware UTC times, sorted."""
    def aware(d):
        return datetime.fromtimestamp(d.timestamp(), tz=timezone.utc)
    return sorted((r.user, r.activity, aware(r.start), aware(r.end)) for r in rows)


BATCHES = [
    # arrival order is not time order inside a batch
    [ev("ann", "12:03", "browse"), ev("bob", "12:01", "search"), ev("ann", "12:00", "browse")],
    # another activity, not later than the span's end: ignored; the same activity, earlier: new start
    [ev("ann", "12:02", "buy"), ev("ann", "11:59", "browse")],
    # another activity, later: a new span; the same activity, later: a new end
    [ev("ann", "12:06", "buy"), ev("ann", "12:05", "buy"), ev("bob", "12:10", "search")],
    # a row without a time is left out; ann's event is not later than the end (equal): ignored
    [ev("carl", None, "browse"), ev("ann", "12:06", "browse")],
]

EXPECTED = [
    [("ann", "browse", t("12:00"), t("12:03")), ("bob", "search", t("12:01"), t("12:01"))],
    [("ann", "browse", t("11:59"), t("12:03"))],
    [("ann", "buy", t("12:05"), t("12:06")), ("bob", "search", t("12:01"), t("12:10"))],
    [("ann", "buy", t("12:05"), t("12:06"))],
]


def test_spans_after_every_batch_equal_the_seed_logic(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add(BATCHES[0])
    out = first_last_activity(land.stream(spark, SCHEMA))
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        for batch in BATCHES[1:]:
            run.wait_input()
            land.add(batch)
        run.wait_input()
        got = [spans(rows) for rows in run.batches]
    assert got == EXPECTED


def test_the_seed_fold_in_python_agrees():
    """The per-event rule, folded over the same events in time order per batch, gives the same spans."""
    state: dict = {}
    after = []
    for batch in BATCHES:
        seen = []
        for e in sorted(batch, key=lambda e: (e["timestamp"] or "", e["activity"])):
            if e["timestamp"] is None:
                continue
            state[e["user"]] = apply_event(state.get(e["user"]), datetime.fromisoformat(e["timestamp"]), e["activity"])
            seen.append(e["user"])
        after.append(sorted((u, s.activity, s.start, s.end) for u, s in state.items() if u in seen))
    assert after == EXPECTED


def test_other_column_names(spark):
    df = spark.createDataFrame([("k", datetime(2024, 1, 1), 7)], "id string, at timestamp, kind int")
    row = first_last_activity(df, key="id", timestamp="at", activity="kind").collect()[0]
    assert (row.id, row.activity, row.start, row.end) == ("k", "7", datetime(2024, 1, 1), datetime(2024, 1, 1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"key": "user_id"}, "first_last_activity: key column 'user_id' is not in the input; its columns are"
                             " user, timestamp, activity. Pass key=<column name>."),
        ({"timestamp": "ts"}, "first_last_activity: timestamp column 'ts' is not in the input"),
        ({"timestamp": "activity"}, "first_last_activity: timestamp column 'activity' must be of type timestamp,"
                                    " but it is string"),
        ({"activity": "page"}, "first_last_activity: activity column 'page' is not in the input"),
        ({"activity": "user"}, "key, timestamp and activity must be three different columns"),
    ],
)
def test_bad_arguments_fail_when_defined(spark, kwargs, message):
    with pytest.raises(ConfigError) as err:
        first_last_activity(spark.createDataFrame([], SCHEMA), **kwargs)
    assert message in str(err.value)


def test_not_a_dataframe():
    with pytest.raises(ConfigError, match="first_last_activity: expected a pyspark DataFrame of events, got list"):
        first_last_activity([])
