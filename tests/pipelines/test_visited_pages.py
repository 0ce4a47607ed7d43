"""visited_pages (seed 002) on real local Spark, with and without an initial state."""

from __future__ import annotations

import pytest

from sparkstate.errors import ConfigError
from sparkstate.pipelines import visited_pages

from ..streams import LandingDir, StreamRun

SCHEMA = "user_id string, page string"


def test_seed_002_outputs_exactly(spark, tmp_path):
    initial = spark.createDataFrame(
        [("a", ["page1", "page2", "page3"]), ("b", ["page4"]), ("c", [])],
        "user_id string, visited_pages array<string>",
    )
    land = LandingDir(tmp_path / "in")
    land.add([{"user_id": "a", "page": "page4"}])
    out = visited_pages(land.stream(spark, SCHEMA), initial_state=initial)
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        # b's two visits arrive in one micro-batch: one output per visit, as mapWithState does
        for batch in ([("b", "page5"), ("b", "page6")], [("a", "page7"), ("d", None), ("d", "page1")]):
            run.wait_input()
            land.add({"user_id": u, "page": p} for u, p in batch)
        # the JSON reader drops the null-page row itself (a pushed-down filter): it is not counted as input
        run.wait_input(land.rows_written - 1)
        got = [[(r.user_id, ", ".join(r.visited_pages)) for r in rows] for rows in run.batches]
    assert got[0] == [("a", "page1, page2, page3, page4")]
    assert got[1] == [("b", "page4, page5"), ("b", "page4, page5, page6")]
    assert sorted(got[2]) == [("a", "page1, page2, page3, page4, page7"), ("d", "page1")]  # null page left out
    assert len(got) == 3  # c, with an initial state and no visits, emits nothing


def test_without_initial_state_and_other_columns(spark):
    df = spark.createDataFrame([(1, "/home"), (2, "/cart")], "uid int, url string")
    out = visited_pages(df, key="uid", page="url")
    assert out.schema.simpleString() == "struct<uid:int,visited_pages:array<string>>"
    assert sorted((r.uid, r.visited_pages) for r in out.collect()) == [(1, ["/home"]), (2, ["/cart"])]


@pytest.mark.parametrize(
    "initial, message",
    [
        ("pages", "initial_state must be a DataFrame with columns user_id, visited_pages (array<string>), got str"),
        ("user_id string, pages array<string>",
         "initial_state must have the columns user_id (the key) and visited_pages (array<string>);"
         " missing visited_pages; it has user_id, pages"),
        ("user_id string, visited_pages string", "initial_state column visited_pages must be an array<string>,"
                                                 " but it is string"),
    ],
)
def test_bad_initial_state(spark, initial, message):
    visits = spark.createDataFrame([], SCHEMA)
    init = spark.createDataFrame([], initial) if " " in initial else initial
    with pytest.raises(ConfigError) as err:
        visited_pages(visits, initial_state=init)
    assert message in str(err.value)


def test_bad_columns(spark):
    visits = spark.createDataFrame([], SCHEMA)
    with pytest.raises(ConfigError, match="visited_pages: page column 'url' is not in the input; its columns are user_id, page"):
        visited_pages(visits, page="url")
    with pytest.raises(ConfigError, match="visited_pages: key column 'user' is not in the input"):
        visited_pages(visits, key="user")
