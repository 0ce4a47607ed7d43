"""What each PySpark minor lacks is refused when the query is defined, in one line naming the
minor that has it; on a minor that has it, the same definition is accepted. Runs in the main suite
and on every minor of the version matrix."""

from __future__ import annotations

import re

import pytest

import sparkstate as ss
from sparkstate.engines import default_engine, runtime
from sparkstate.errors import ConfigError
from tests.streams import LandingDir, StreamRun


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


def _committed(ck) -> int:
    return max(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())


def test_the_state_tools_read_this_minor_s_checkpoint_as_the_query_saw_it(spark, tmp_path, capsys):
    """Every minor: `ss.state.read/keys/stats/export` and `sparkstate state show|stats` on a
    checkpoint the minor's default engine wrote (3.5: inband, no state reader in Spark, read
    through Spark's state store on the driver) give the running counts the query itself output,
    at the latest batch and at an earlier one; the export starts a new query where the default
    engine takes initial state, and is refused in one line where it does not."""
    import json

    from sparkstate.cli import main

    land = LandingDir(tmp_path / "in")
    ck = tmp_path / "ck"

    def counts(source_dir=land, **kw):
        return ss.map_groups_with_state(source_dir.stream(spark, "k string"), key="k", func=_count, state_type=int,
                                        output_type="k string, n long", **kw)

    land.add([{"k": w} for w in "a b a".split()])
    with StreamRun(spark, counts(), ck, landing=land) as run:
        run.wait_input()
        first_batch, first = _committed(ck), {r.k: r.n for r in run.rows}
        land.add([{"k": w} for w in "a c".split()])
        run.wait_input()
        latest = {r.k: r.n for r in run.rows}  # the last count output per key: what the state holds
    assert first == {"a": 2, "b": 1} and latest == {"a": 3, "b": 1, "c": 1}
    assert _committed(ck) > first_batch

    assert {r.k: r.value for r in ss.state.read(spark, ck).collect()} == latest
    assert {r.k: r.value for r in ss.state.read(spark, ck, batch_id=first_batch).collect()} == first
    assert ss.state.keys(spark, ck) == 3 and ss.state.keys(spark, ck, batch_id=first_batch) == 2
    st = ss.state.stats(spark, ck)
    assert st.keys == 3 and sum(p.keys for p in st.partitions) == 3 and len(st.partitions) == 2
    assert st.keys_per_batch[first_batch] == 2 and st.keys_per_batch[_committed(ck)] == 3
    assert st.operator["engine"] == default_engine() and st.bytes_on_disk > 0

    capsys.readouterr()
    assert main(["state", "show", str(ck), "--json", "--limit", "0"]) == 0
    assert {d["k"]: d["value"] for d in map(json.loads, capsys.readouterr().out.splitlines())} == latest
    assert main(["state", "show", str(ck), "--json", "--batch", str(first_batch)]) == 0
    assert {d["k"]: d["value"] for d in map(json.loads, capsys.readouterr().out.splitlines())} == first
    assert main(["state", "stats", str(ck)]) == 0
    out = capsys.readouterr().out
    assert f"layout: {default_engine()} engine" in out and "keys: 3 (0 with a pending timeout)" in out

    assert ss.state.export(spark, ck, tmp_path / "export") == 3
    exported = spark.read.parquet(str(tmp_path / "export"))
    assert {r.k: r.value for r in exported.collect()} == latest
    land2 = LandingDir(tmp_path / "in2")
    land2.add([{"k": w} for w in "a d".split()])
    try:
        query = counts(land2, initial_state=exported)
    except ConfigError as err:  # said in one line by an engine that takes none (3.5's inband, as yet)
        assert "initial_state" in str(err) and "\n" not in str(err)
        return
    with StreamRun(spark, query, tmp_path / "ck2", landing=land2) as run:
        run.wait_input()
        assert {r.k: r.n for r in run.rows} == {"a": 4, "d": 1}
    assert {r.k: r.value for r in ss.state.read(spark, tmp_path / "ck2").collect()} == {**latest, "a": 4, "d": 1}


def test_the_inband_engine_takes_initial_state(spark, tmp_path):
    # applyInPandasWithState has no initial state: the engine seeds the buckets itself (running
    # it, restarts included: tests/engines/test_inband_initial_state.py)
    land = LandingDir(tmp_path / "in")
    land.add([{"k": "a"}])
    out = ss.map_groups_with_state(land.stream(spark, "k string"), key="k", func=_count, state_type=int,
                                   output_type="k string, n long", engine="inband",
                                   initial_state=spark.createDataFrame([("a", 1)], "k string, value long"))
    assert out.isStreaming
