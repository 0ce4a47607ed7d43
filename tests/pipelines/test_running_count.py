"""running_count on real local Spark: each key's total after every micro-batch."""

from __future__ import annotations

import pytest

from sparkstate.errors import ConfigError
from sparkstate.pipelines import running_count

from ..streams import LandingDir, StreamRun


def test_totals_after_every_batch(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    batches = [["spark", "state", "spark"], ["spark"], ["state", "state", "new"]]
    land.add({"word": w} for w in batches[0])
    out = running_count(land.stream(spark, "word string"))
    with StreamRun(spark, out, tmp_path / "ck", landing=land) as run:
        for words in batches[1:]:
            run.wait_input()
            land.add({"word": w} for w in words)
        run.wait_input()
        got = [sorted(tuple(r) for r in rows) for rows in run.batches]
    assert got == [
        [("spark", 2), ("state", 1)],
        [("spark", 3)],  # a key without rows in a batch is not repeated
        [("new", 1), ("state", 3)],
    ]


def test_another_key_column_and_its_type_are_kept(spark):
    df = spark.createDataFrame([(3, "x"), (3, "y"), (None, "z")], "n int, other string")
    out = running_count(df, key="n")
    assert out.schema.simpleString() == "struct<n:int,count:bigint>"
    assert sorted(out.collect(), key=lambda r: (r.n is None, r.n)) == [(3, 2), (None, 1)]


@pytest.mark.parametrize(
    "key, message",
    [
        ("words", "running_count: key column 'words' is not in the input; its columns are word, count."
                  " Pass key=<column name>."),
        ("count", "the key column cannot be called 'count'"),
    ],
)
def test_bad_key(spark, key, message):
    with pytest.raises(ConfigError) as err:
        running_count(spark.createDataFrame([], "word string, count long"), key=key)
    assert message in str(err.value)
