"""The ``delta:PATH`` sink (delta-rs from foreachBatch): exactly once through a replayed batch."""

from __future__ import annotations

import pytest

from sparkstate.errors import ConfigError
from sparkstate.io.delta import DeltaBatchWriter, committed_version, read_delta
from sparkstate.io.sinks import parse_sink, start_sink
from sparkstate.pipelines import running_count
from tests.io.replay import drop_last_commit
from tests.streams import LandingDir


def test_delta_specs():
    s = parse_sink("delta:/data/t")
    assert (s.kind, s.path, str(s), s.deadletter_default) == ("delta", "/data/t", "delta:/data/t", "/data/t/_deadletter")
    with pytest.raises(ConfigError, match="'delta' needs the table's directory"):
        parse_sink("delta:")


def test_delta_sink_skips_a_replayed_batch(spark, tmp_path):
    """Batch N committed to Delta, Spark's commit log lost (the driver died in between): the restart
    runs batch N again and the sink skips it, so each batch's rows are in the table once; the
    table's application transaction for the query holds the last batch id."""
    landing, out, ck = LandingDir(tmp_path / "in"), tmp_path / "counts", tmp_path / "ck"

    def run() -> str:
        query = start_sink(running_count(landing.stream(spark, "word string")), f"delta:{out}", checkpoint=ck,
                           output_mode="update")
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert query.exception() is None
        return str(query.id)

    landing.add([{"word": w} for w in "abca"])
    qid = run()
    assert committed_version(str(out), f"sparkstate:{qid}") == 0
    replayed = drop_last_commit(ck)
    landing.add([{"word": w} for w in "ab"])
    assert run() == qid  # same checkpoint, same query id, same app id
    rows = sorted((r["word"], r["count"]) for r in read_delta(str(out)).to_pylist())
    assert rows == [("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1)]
    assert committed_version(str(out), f"sparkstate:{qid}") == replayed + 1


def test_delta_writer_called_twice_with_one_batch_id_writes_once(spark, tmp_path):
    writer = DeltaBatchWriter(str(tmp_path / "t"), app_id="app-1")
    df = spark.createDataFrame([("u1", 1), ("u2", 2)], "user_id string, n long")
    writer(df, 0)
    writer(df, 0)
    writer(spark.createDataFrame([], "user_id string, n long"), 1)  # empty: nothing committed
    writer(df, 2)
    assert sorted((r["user_id"], r["n"]) for r in read_delta(str(tmp_path / "t")).to_pylist()) == [
        ("u1", 1), ("u1", 1), ("u2", 2), ("u2", 2)]
    assert committed_version(str(tmp_path / "t"), "app-1") == 2
    assert committed_version(str(tmp_path / "t"), "other") is None


def test_delta_sink_writes_from_the_executors_where_delta_spark_fits(spark, tmp_path):
    """On PySpark 3.5 (delta-spark 3.x fetched with the connectors, as the version matrix does) the
    batches are written by Spark's Delta writer, elsewhere by delta-rs on the driver; either way
    the table reads back with deltalake the same, the replayed batch skipped."""
    from sparkstate.io import connectors
    from sparkstate.io.delta import executors_write
    from deltalake import DeltaTable

    fits = connectors.delta_coordinates(spark.version) is not None
    assert executors_write(spark) is fits, "on 3.5: python -m sparkstate.io.connectors fetch (adds delta-spark)"
    out = tmp_path / "t"
    writer = DeltaBatchWriter(str(out), app_id="app-x")
    df = spark.createDataFrame([("u1", 1, None), ("u2", 2**62 + 1, 1.5)], "user_id string, n long, x double")
    writer(df, 0)
    writer(df, 0)
    writer(df.limit(1), 1)
    rows = sorted(tuple(r.values()) for r in read_delta(str(out)).to_pylist())
    assert rows == [("u1", 1, None), ("u1", 1, None), ("u2", 2**62 + 1, 1.5)]
    assert committed_version(str(out), "app-x") == 1
    engines = {str(c.get("engineInfo") or c.get("clientVersion")) for c in DeltaTable(str(out)).history()
               if c.get("operation") != "CREATE TABLE"}
    assert all(("Delta-Lake/3." in e) is fits for e in engines), engines
