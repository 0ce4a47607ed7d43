"""The owed no-data batch, told from Spark's offset and commit logs, and planned in the offset log.

The logs here are written as Spark writes them (pyspark 4.3.0: ``v1``, the metadata line, one
line per source); tests/reliability/test_stop_between_batches.py runs real queries on them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sparkstate.errors import ConfigError
from sparkstate.owed_batch import NO_DATA_BATCHES, OwedBatch, owed_batch, queue_owed_batch

CONF = {"spark.sql.shuffle.partitions": "2", "spark.sql.streaming.stateStore.encodingFormat": "unsaferow"}


def _batch(ck: Path, n: int, watermark: int, next_watermark: int | None, *, version: str = "v1",
           offsets: tuple[str, ...] = ('{"logOffset":3}', '{"logOffset":3}')) -> None:
    """``offsets/n`` (and ``commits/n`` unless ``next_watermark`` is None) as Spark writes them."""
    (ck / "offsets").mkdir(parents=True, exist_ok=True)
    (ck / "commits").mkdir(exist_ok=True)
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 1_700_000_000_000 + n, "conf": CONF}
    (ck / "offsets" / str(n)).write_text("\n".join([version, json.dumps(meta, separators=(",", ":")), *offsets]))
    if next_watermark is not None:
        (ck / "commits" / str(n)).write_text(f'v1\n{{"nextBatchWatermarkMs":{next_watermark}}}')


def test_owed_after_a_batch_that_moved_the_watermark(tmp_path):
    _batch(tmp_path, 0, 0, 5_000)
    _batch(tmp_path, 1, 5_000, 9_000)
    assert owed_batch(tmp_path, processing_time=False) == OwedBatch(2, 9_000, "watermark")


def test_nothing_owed_when_the_watermark_stayed_or_a_batch_is_in_flight(tmp_path):
    assert owed_batch(tmp_path, processing_time=False) is None  # a new checkpoint
    _batch(tmp_path, 0, 0, 5_000)
    _batch(tmp_path, 1, 5_000, 5_000)  # the no-data batch ran: the watermark stayed
    assert owed_batch(tmp_path, processing_time=False) is None
    _batch(tmp_path, 2, 5_000, None)  # planned, not committed: Spark runs it again on start
    assert owed_batch(tmp_path, processing_time=False) is None


def test_processing_time_timers_owe_a_batch_after_every_batch(tmp_path):
    _batch(tmp_path, 0, 0, 0)
    assert owed_batch(tmp_path, processing_time=True) == OwedBatch(1, 0, "processing_time")


def test_queue_writes_the_batch_spark_would_plan(spark, tmp_path):
    _batch(tmp_path, 0, 0, 5_000)
    _batch(tmp_path, 1, 5_000, 9_000, offsets=('{"logOffset":7}', "-"))
    planned = queue_owed_batch(spark, tmp_path, processing_time=False)
    assert planned == OwedBatch(2, 9_000, "watermark")
    before = (tmp_path / "offsets" / "1").read_text().split("\n")
    after = (tmp_path / "offsets" / "2").read_text().split("\n")
    assert after[0] == "v1" and after[2:] == before[2:] == ['{"logOffset":7}', "-"]  # nothing new to read
    meta = json.loads(after[1])
    assert meta["batchWatermarkMs"] == 9_000 and meta["conf"] == CONF  # the settings the query keeps
    assert meta["batchTimestampMs"] > json.loads(before[1])["batchTimestampMs"]
    assert owed_batch(tmp_path, processing_time=False) is None  # planned: Spark runs it on start
    assert queue_owed_batch(spark, tmp_path, processing_time=False) is None


def test_an_offset_log_of_an_unknown_layout_is_left_alone(spark, tmp_path, caplog):
    _batch(tmp_path, 0, 0, 5_000, version="v9")
    with caplog.at_level(logging.WARNING, logger="sparkstate.owed_batch"):
        assert queue_owed_batch(spark, tmp_path, processing_time=False) is None
    assert not (tmp_path / "offsets" / "1").exists()
    assert "offset log version v9 is not one this release knows (v1, v2)" in caplog.text


def test_no_data_batches_turned_off_owe_nothing(spark, tmp_path):
    _batch(tmp_path, 0, 0, 5_000)
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        assert queue_owed_batch(spark, tmp_path, processing_time=False) is None
    finally:
        spark.conf.set(NO_DATA_BATCHES, "true")
    assert not (tmp_path / "offsets" / "1").exists()


def test_a_log_entry_that_is_not_spark_s_is_refused(tmp_path):
    _batch(tmp_path, 0, 0, 5_000)
    (tmp_path / "commits" / "0").write_text("not a log\n")
    with pytest.raises(ConfigError, match=r"commits/0: not a log entry of a Spark streaming query: expected a"
                       r" version line \(v1\) and a JSON line, got 'not a log' first; point at the checkpoint"):
        owed_batch(tmp_path, processing_time=False)


def test_refused_while_a_query_runs_on_the_checkpoint(spark, tmp_path):
    ck = tmp_path / "ck"
    q = (spark.readStream.format("rate").option("rowsPerSecond", 1).load().writeStream.format("noop")
         .option("checkpointLocation", str(ck)).queryName("owed_running").start())
    try:
        with pytest.raises(ConfigError, match=r"the query owed_running is running on .*ck; it plans its own batches"):
            queue_owed_batch(spark, ck, processing_time=False)
    finally:
        q.stop()
