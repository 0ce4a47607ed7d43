"""What each PySpark minor lacks is refused when the query is defined, in one line naming the
minor that has it; on a minor that has it, the same definition is accepted. Runs in the main suite
and on every minor of the version matrix."""

from __future__ import annotations

import re

import pytest

import sparkstate as ss
from sparkstate.engines import runtime
from sparkstate.errors import ConfigError
from tests.streams import LandingDir


def _count(key, rows, state):
    n = (state.getOption or 0) + sum(1 for _ in rows)
    state.update(n)
    return (key, n)


@pytest.mark.parametrize("case, feature, message", [
    ("batched", runtime.TRANSFORM_WITH_STATE_IN_PANDAS,
     "engine='batched' (Spark's transformWithStateInPandas) needs PySpark 4.0"),
    ("tws", runtime.TRANSFORM_WITH_STATE_IN_PANDAS, "engine='tws' (Spark's transformWithState) needs PySpark 4.0"),
    ("ttl", runtime.TRANSFORM_WITH_STATE_IN_PANDAS, "state_ttl (Spark's per-key TTL of transformWithState) needs PySpark 4.0"),
])
def test_what_this_minor_lacks_is_one_line_naming_the_minor_that_has_it(spark, tmp_path, case, feature, message):
    land = LandingDir(tmp_path / "in")
    land.add([{"k": "a"}])
    kwargs = {"engine": case} if case != "ttl" else {"state_ttl": "1 minute",
                                                      "timeout": ss.GroupStateTimeout.ProcessingTimeTimeout}

    def define():
        return ss.map_groups_with_state(land.stream(spark, "k string"), key="k", func=_count, state_type=int,
                                        output_type="k string, n long", **kwargs)

    if runtime.has(feature):
        assert define().isStreaming  # running it is the main suite's (tests/engines)
    else:
        with pytest.raises(ConfigError, match=re.escape(message)) as err:
            define()
        assert "\n" not in str(err.value)
        assert f"this is PySpark {'.'.join(map(str, runtime.pyspark_minor()))}" in str(err.value)


def test_the_state_tools_read_this_minor_s_checkpoint_or_say_which_minor_can(spark, tmp_path):
    land = LandingDir(tmp_path / "in")
    land.add([{"k": w} for w in "a b a".split()])
    out = ss.map_groups_with_state(land.stream(spark, "k string"), key="k", func=_count, state_type=int,
                                   output_type="k string, n long")
    ck = tmp_path / "ck"
    q = out.writeStream.outputMode("update").format("memory").queryName("runtime_tools") \
        .option("checkpointLocation", str(ck)).start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    assert sorted(tuple(r) for r in spark.table("runtime_tools").collect()) == [("a", 2), ("b", 1)]
    if runtime.has(runtime.STATE_READERS):
        assert sorted((r.k, r.value) for r in ss.state.read(spark, ck).collect()) == [("a", 2), ("b", 1)]
    else:
        with pytest.raises(ConfigError, match=re.escape("needs PySpark 4.0 or later")) as err:
            ss.state.read(spark, ck)
        assert "\n" not in str(err.value)


def test_the_inband_engine_takes_initial_state(spark, tmp_path):
    # applyInPandasWithState has no initial state: the engine seeds the buckets itself (running
    # it, restarts included: tests/engines/test_inband_initial_state.py)
    land = LandingDir(tmp_path / "in")
    land.add([{"k": "a"}])
    out = ss.map_groups_with_state(land.stream(spark, "k string"), key="k", func=_count, state_type=int,
                                   output_type="k string, n long", engine="inband",
                                   initial_state=spark.createDataFrame([("a", 1)], "k string, value long"))
    assert out.isStreaming
