"""Per-batch metrics from Spark's progress reports (a report captured from a real sessionize run)."""

from __future__ import annotations

import json

from sparkstate.observe.metrics import RunTotals, batch_metrics, redact

# A no-data batch of an event-time sessionize query (PySpark 4.3), trimmed to the fields read.
REPORT = json.loads("""{
  "id": "8efea7a1-4ec9-4638-8a26-c385f717a96e", "runId": "c2f466aa-5093-44d4-89b1-9a17b4b072b3",
  "name": "sparkstate_sessionize", "timestamp": "2026-11-22T04:50:53.779Z", "batchId": 3,
  "batchDuration": 746, "numInputRows": 0, "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 0.0,
  "durationMs": {"addBatch": 510, "triggerExecution": 746},
  "eventTime": {"watermark": "2024-01-01T00:54:47.925Z"},
  "stateOperators": [{"operatorName": "transformWithStateInPySparkExec", "numRowsTotal": 1,
    "numRowsUpdated": 0, "numRowsRemoved": 3, "memoryUsedBytes": 1058064,
    "customMetrics": {"numDeletedTimers": 3, "numExpiredTimers": 0, "numRegisteredTimers": 0}}],
  "sources": [{"description": "FileStreamSource[file:/tmp/in]", "startOffset": {"logOffset": 2},
    "endOffset": {"logOffset": 2}, "numInputRows": 0}],
  "sink": {"description": "FileSink[file:/tmp/out]", "numOutputRows": -1},
  "observedMetrics": {"sparkstate_output": {"rows": 3, "timed_out": 3}}
}""")


def test_fields_of_a_real_report():
    m = batch_metrics(REPORT, "output", dead_letters_total=4)
    assert m.to_dict() == {
        "time": "2026-11-22T04:50:53.779Z", "query": "output", "query_name": "sparkstate_sessionize",
        "run_id": "c2f466aa-5093-44d4-89b1-9a17b4b072b3", "batch_id": 3, "rows_in": 0,
        "input_rows_per_s": 0.0, "processed_rows_per_s": 0.0, "batch_duration_ms": 746,
        "state_rows": 1, "state_rows_updated": 0, "state_rows_removed": 3, "state_memory_bytes": 1058064,
        "timers_expired": 0, "rows_out": 3, "timed_out": 3, "dead_letters": 0, "dead_letters_total": 4,
        "watermark": "2024-01-01T00:54:47.925Z", "late": None, "rows_dropped_by_watermark": None,
        "backlog": None,  # a file source reports no latest offset
        "state_point_reads": None, "state_bytes_scanned": None, "state_reads": None,  # no RocksDB metrics in it
        # the batch's time by stage: the trimmed report keeps only addBatch
        "offsets_ms": None, "planning_ms": None, "add_batch_ms": 510, "log_commit_ms": None,
    }


def test_missing_numbers_are_none_not_zero():
    m = batch_metrics({"batchId": 0, "numInputRows": 5, "sink": {"numOutputRows": -1},
                       "inputRowsPerSecond": float("nan")}, "output")
    assert (m.rows_out, m.state_rows, m.state_memory_bytes, m.timers_expired, m.input_rows_per_s) == (None,) * 5
    assert batch_metrics({"batchId": 0, "numInputRows": 5, "sink": {"numOutputRows": 5}}, "output").rows_out == 5


def test_dead_letter_batches_count_into_the_total():
    t = RunTotals()
    t = t.add(batch_metrics(REPORT, "output", t.dead_letters))
    dead = {"batchId": 0, "numInputRows": 9, "observedMetrics": {"sparkstate_dead_letters": {"rows": 2}}}
    m = batch_metrics(dead, "dead_letters", t.dead_letters)
    t = t.add(m)
    assert (m.dead_letters, m.rows_out, t.dead_letters, t.batches, t.rows_in, t.rows_out) == (2, 2, 2, 1, 0, 3)
    assert t.state_rows == 1 and t.watermark == "2024-01-01T00:54:47.925Z"


def test_redact_hides_passwords():
    assert redact("postgres:postgresql://app:s3cret@db:5432/shop/t") == "postgres:postgresql://app:***@db:5432/shop/t"
    assert redact("kafka://u:p%40ss@broker:9092") == "kafka://u:***@broker:9092"
    assert redact("url?user=a&password=s3cret&x=1") == "url?user=a&password=***&x=1"
    assert redact("token: abc123") == "token: ***"
    assert redact("files:/data/in") == "files:/data/in"


def test_backlog_is_the_sources_latest_offset_beyond_the_batch():
    """A generator source 1,500 records ahead of the batch's end; Kafka partitions summed; the
    job's two reads of one source count once."""
    gen = {"startOffset": {"index": 0}, "endOffset": {"index": 500}, "latestOffset": {"index": 2000}}
    m = batch_metrics({"batchId": 1, "numInputRows": 500, "sources": [gen, dict(gen)]}, "output")
    assert m.backlog == 1500
    assert RunTotals().add(m).backlog == 1500
    kafka = {"endOffset": {"clicks": {"0": 100, "1": 80}}, "latestOffset": {"clicks": {"0": 150, "1": 90}}}
    assert batch_metrics({"batchId": 2, "sources": [kafka]}, "output").backlog == 60
    caught_up = {"endOffset": {"index": 2000}, "latestOffset": {"index": 2000}}
    assert batch_metrics({"batchId": 3, "sources": [caught_up]}, "output").backlog == 0
