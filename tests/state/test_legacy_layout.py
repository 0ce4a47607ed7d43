"""Checkpoints of the tws engine's layout 1 (earlier releases: the state's fields as Spark columns of
variable ``sparkstate``): the state tools read them, a query on the current layout refuses them
with the export -> initial-state way out, and that way out continues the state exactly."""

from __future__ import annotations

import pytest
from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

import sparkstate as ss
from tests.conftest import checkpoint_encoding
from tests.streams import LandingDir, StreamRun, failure

#: What layout 1 stored for ``state_type=int``: the state's column, then existence and timeout.
LAYOUT_1 = StructType([StructField("value", LongType(), True), StructField("_sparkstate_exists", BooleanType(), True),
                       StructField("_sparkstate_timeout_ms", LongType(), True)])


class Layout1Counter(StatefulProcessor):
    """Counts words the way the layout-1 tws engine stored a ``state_type=int`` state."""

    def init(self, handle):
        self.vs = handle.getValueState("sparkstate", LAYOUT_1)

    def handleInputRows(self, key, rows, timerValues):
        stored = self.vs.get()
        n = (stored[0] if stored is not None else 0) + sum(1 for _ in rows)
        self.vs.update((n, True, None))
        yield Row(word=key[0], n=n)

    def close(self):
        pass


def count_words(word, rows, state):
    n = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(n)
    return (word, n)


def test_layout_1_checkpoint_is_read_refused_and_moved(spark, tmp_path, state_encoding):
    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"
    land.add([{"word": w} for w in "a b a".split()])
    legacy = land.stream(spark, "word string").groupBy("word").transformWithState(
        Layout1Counter(), "word string, n long", "Update", "None")
    with StreamRun(spark, legacy, ck, landing=land) as run:
        run.wait_input()
    assert checkpoint_encoding(ck) == state_encoding

    # the tools read it
    assert ss.state.engine_of(spark, ck) == "tws"
    assert sorted(tuple(r) for r in ss.state.read(spark, ck).collect()) == [("a", 2, None), ("b", 1, None)]
    assert ss.state.keys(spark, ck) == 2

    def query(src, **kw):
        return ss.map_groups_with_state(src, key="word", func=count_words, state_type=int,
                                        output_type="word string, n long", **kw)

    # with checkpoint=: refused when defined, in words, with the way out
    with pytest.raises(ss.StateSchemaError, match="earlier sparkstate release") as refused:
        query(land.stream(spark, "word string"), checkpoint=ck)
    assert "ss.state.export" in str(refused.value) and "initial_state=" in str(refused.value)

    # without it: Spark refuses to start the tws engine on it (its state is never silently ignored)
    land.add([{"word": "a"}])
    with StreamRun(spark, query(land.stream(spark, "word string"), engine="tws"), ck, landing=land, already_read=3) as run:
        text = failure(run)
    assert "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE" in text or "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION" in text
    assert sorted(tuple(r) for r in ss.state.read(spark, ck).collect()) == [("a", 2, None), ("b", 1, None)]

    # the way out: export, then a new checkpoint started from it continues the counts
    assert ss.state.export(spark, ck, tmp_path / "state.parquet") == 2
    initial = spark.read.parquet(str(tmp_path / "state.parquet"))
    land2 = LandingDir(tmp_path / "in2")
    land2.add([{"word": w} for w in "a c".split()])
    with StreamRun(spark, query(land2.stream(spark, "word string"), initial_state=initial), tmp_path / "ck2",
                   landing=land2) as run:
        run.wait_input()
        assert sorted(tuple(r) for r in run.rows) == [("a", 3), ("c", 1)]
