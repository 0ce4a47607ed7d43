"""MetricsListener: one JSON line per batch of the watched queries, nothing secret, never breaks Spark."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

from sparkstate.observe.listener import MetricsListener


def event(report: dict) -> SimpleNamespace:
    return SimpleNamespace(progress=SimpleNamespace(json=json.dumps(report)))


def report(qid: str, batch: int, rows: int, **extra) -> dict:
    return {"id": qid, "runId": "r", "name": extra.pop("name", "q"), "batchId": batch, "numInputRows": rows, **extra}


def test_one_line_per_batch_of_watched_queries_only(tmp_path):
    path = tmp_path / "m.jsonl"
    seen = []
    listener = MetricsListener(path, on_batch=lambda m, t: seen.append((m.batch_id, t.rows_in)))
    output, dead = SimpleNamespace(id="q1"), SimpleNamespace(id="q2")
    listener.onQueryProgress(event(report("q1", 0, 10)))  # before watch(): kept, recorded on watch()
    listener.watch(output, "output")
    listener.watch(dead, "dead_letters")
    listener.onQueryProgress(event(report("q2", 0, 10, observedMetrics={"sparkstate_dead_letters": {"rows": 1}})))
    listener.onQueryProgress(event(report("other", 0, 99)))  # another query of the session
    listener.onQueryProgress(event(report("q1", 1, 5)))
    assert listener.wait_for(output, 1, timeout_s=1)
    assert not listener.wait_for(output, 2, timeout_s=0.1)
    listener.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(m["query"], m["batch_id"], m["rows_in"], m["dead_letters_total"]) for m in lines] == [
        ("output", 0, 10, 0), ("dead_letters", 0, 10, 1), ("output", 1, 5, 1)]
    assert seen == [(0, 10), (0, 10), (1, 15)]
    assert listener.totals.batches == 2 and listener.totals.dead_letters == 1


def test_no_secret_reaches_the_file(tmp_path):
    path = tmp_path / "m.jsonl"
    listener = MetricsListener(path)
    q = SimpleNamespace(id="q1")
    listener.watch(q)
    secret = "postgresql://app:s3cret@db:5432/shop"
    listener.onQueryProgress(event(report(
        "q1", 0, 1, name=f"job {secret}", sink={"description": f"ForeachBatchSink[{secret}]", "numOutputRows": 1},
        sources=[{"description": f"Jdbc[{secret}]", "startOffset": None, "endOffset": 1}],
    )))
    listener.close()
    text = path.read_text()
    assert "s3cret" not in text and json.loads(text)["query_name"] == "job postgresql://app:***@db:5432/shop"


def test_a_failing_callback_is_logged_not_raised(tmp_path, caplog):
    def broken(m, t):
        raise RuntimeError("display broke")

    listener = MetricsListener(None, on_batch=broken)
    listener.watch(SimpleNamespace(id="q1"))
    with caplog.at_level(logging.ERROR, logger="sparkstate.observe"):
        listener.onQueryProgress(event(report("q1", 0, 1)))
        listener.onQueryProgress(SimpleNamespace(progress=SimpleNamespace(json="not json")))
    assert "the on_batch callback failed (batch 0)" in caplog.text
    assert "could not read a progress report" in caplog.text
    assert listener.totals.batches == 1


def test_appends_to_an_existing_file(tmp_path):
    path = tmp_path / "sub" / "m.jsonl"
    for batch in (0, 1):
        listener = MetricsListener(path)
        listener.record(report("q", batch, 1), "output")
        listener.close()
    assert [json.loads(line)["batch_id"] for line in path.read_text().splitlines()] == [0, 1]


def test_progress_read_from_json_is_the_report_pyspark_hands_over(spark):
    # A listener of ours next to a plain PySpark one, on the same query: the same reports (the
    # JVM's own JSON) and the same observed metrics, as Rows.
    import time

    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    from sparkstate.observe.listener import JsonProgressListener

    class Plain(StreamingQueryListener):
        def __init__(self):
            self.seen = {}

        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            self.seen[event.progress.batchId] = (json.loads(event.progress.json), event.progress.observedMetrics)

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            pass

    class Ours(JsonProgressListener, Plain):
        def onQueryProgress(self, event):
            self.from_json = getattr(event.progress, "_jprogress", "?") is None  # no JVM object behind it
            super().onQueryProgress(event)

    plain, ours = Plain(), Ours()
    for lst in (plain, ours):
        spark.streams.addListener(lst)
    try:
        rows = spark.readStream.format("rate").option("rowsPerSecond", 20).load() \
            .observe("seen", F.count(F.lit(1)).alias("rows"))
        q = rows.groupBy((F.col("value") % 3).alias("k")).count() \
            .writeStream.outputMode("update").format("memory").queryName("json_progress").start()
        try:
            deadline = time.monotonic() + 300
            while not ({0, 1, 2} <= set(plain.seen) & set(ours.seen)) and time.monotonic() < deadline:
                q.awaitTermination(0.2)
        finally:
            q.stop()
    finally:
        for lst in (plain, ours):
            spark.streams.removeListener(lst)
    for batch in (0, 1, 2):
        assert ours.seen[batch] == plain.seen[batch]
        report, observed = ours.seen[batch]
        assert report["batchId"] == batch and report["stateOperators"][0]["numRowsTotal"] <= 3
        assert observed["seen"].rows == report["numInputRows"]
    assert sum(ours.seen[b][0]["numInputRows"] for b in (0, 1, 2)) > 0
    assert ours.from_json is True
