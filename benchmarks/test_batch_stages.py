"""benchmarks.batch_stages on the event log of a real streaming query (local Spark in a child
process: the event log is turned on when a session starts)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from benchmarks.batch_stages import breakdown, main, read_log

# One file a micro-batch: 1, 1, 3 and 1 records, so three batches read the fewest (one record).
QUERY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import sparkstate as ss
    root = Path(sys.argv[1])
    for i, words in enumerate([["a"], ["b"], ["a", "b", "c"], ["c"]]):
        (root / "in").mkdir(exist_ok=True)
        (root / "in" / f"part-{i}.json").write_text("".join(json.dumps({"word": w}) + "\\n" for w in words))
    spark = ss.spark_session("batch-stages-test", config={
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": (root / "log").as_uri(),
        "spark.eventLog.compress": "false"})
    counts = (spark.readStream.schema("word string").option("maxFilesPerTrigger", 1).json(str(root / "in"))
              .groupBy("word").count())
    q = (counts.writeStream.outputMode("update").format("noop").queryName("word_counts")
         .option("checkpointLocation", str(root / "ck")).start())
    q.processAllAvailable()
    q.stop()
    spark.stop()
""")


@pytest.fixture(scope="module")
def event_log(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    (root / "log").mkdir()
    done = subprocess.run([sys.executable, "-c", QUERY, str(root)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (log,) = list((root / "log").iterdir())
    return log


def test_the_batches_that_read_the_fewest_records_stage_by_stage(event_log, capsys):
    log = read_log(event_log)
    assert log.name == "batch-stages-test"
    ((name, (taken, figures)),) = breakdown(log).items()
    assert name == "word_counts" and taken == 3
    # the batch and its phases; Spark's aggregation: one job, a stage before the shuffle, one after
    assert figures["progress triggerExecution"] >= figures["progress addBatch"] > 0
    assert figures["Spark jobs"] == 1 and figures["job 0"] > 0
    assert figures["job 0 stage 0: tasks"] == 1 and figures["job 0 stage 1: tasks"] >= 1
    assert figures["job 0 stage 1: task (longest)"] >= figures["job 0 stage 1: task (median)"] > 0
    assert 0 <= figures["physical plan (SQL start to job start)"] < figures["progress addBatch"]
    # the batch of three records, alone
    assert breakdown(log, rows=3)["word_counts"][0] == 1
    assert main([str(event_log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== batch-stages-test / word_counts: 3 batches") and "job 0 stage 1" in out


def test_a_compressed_log_is_refused_in_one_line(tmp_path):
    (tmp_path / "events_1_local-1.zstd").write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(SystemExit, match="compressed; run the query with spark.eventLog.compress false"):
        read_log(tmp_path)
