"""Caught-up detection and stopping between batches, on stand-ins for StreamingQuery."""

from __future__ import annotations

import json

import pytest

from sparkstate.errors import JobFailedError
from sparkstate.jobs.control import is_caught_up, stop_after_current_batch, wait_until_caught_up


class Progress:
    def __init__(self, batch: int, start, end) -> None:
        self.batchId = batch
        self.json = json.dumps({"batchId": batch, "sources": [{"startOffset": start, "endOffset": end}]})

    def __getitem__(self, key: str):  # as PySpark's progress (a dict on 3.5, read like one on 4.x)
        return json.loads(self.json)[key]


class FakeQuery:
    """Replays a list of (status, lastProgress) snapshots, one per look at the status."""

    def __init__(self, snapshots, error=None) -> None:
        self.snapshots = list(snapshots)
        self.i = -1
        self.stopped = False
        self.error = error

    @property
    def isActive(self) -> bool:
        return not self.stopped and self.error is None

    @property
    def status(self) -> dict:
        self.i = min(self.i + 1, len(self.snapshots) - 1)
        return self.snapshots[self.i][0]

    @property
    def lastProgress(self):
        return self.snapshots[max(self.i, 0)][1]

    def exception(self):
        return self.error

    def stop(self) -> None:
        self.stopped = True


def status(message: str, available: bool, active: bool) -> dict:
    return {"message": message, "isDataAvailable": available, "isTriggerActive": active}


START = status("Initializing sources", False, False)
RUNNING = status("Processing new data", True, True)
BETWEEN_WITH_DATA = status("Waiting for next trigger", True, False)
DRAINED = status("Waiting for next trigger", False, False)
NO_DATA_RUNNING = status("No new data but cleaning up state", False, True)


def test_caught_up_when_the_last_trigger_found_nothing_new():
    assert not is_caught_up(FakeQuery([(START, None)]))
    assert not is_caught_up(FakeQuery([(RUNNING, None)]))
    assert not is_caught_up(FakeQuery([(BETWEEN_WITH_DATA, Progress(0, None, 0))]))
    assert is_caught_up(FakeQuery([(DRAINED, Progress(0, None, 0))]))
    assert is_caught_up(FakeQuery([(status("Waiting for data to arrive", False, False), None)]))  # empty input


def test_caught_up_from_a_no_data_batch_when_batches_leave_no_gap():
    # processing-time timers: a no-data batch at every trigger, back to back
    assert is_caught_up(FakeQuery([(NO_DATA_RUNNING, Progress(3, 2, 2))]))
    assert not is_caught_up(FakeQuery([(NO_DATA_RUNNING, Progress(2, 1, 2))]))  # the last batch read data
    assert not is_caught_up(FakeQuery([(RUNNING, Progress(0, None, 0))]))


def test_the_owed_batch_a_restart_runs_first_is_no_sign_of_being_caught_up():
    # batch 4, the no-data batch a stop left owed, ran first (its offsets are batch 3's): the sources
    # were not asked, so more input may wait (the files a --once run must still read)
    owed_ran = Progress(4, 3, 3)
    assert is_caught_up(FakeQuery([(DRAINED, owed_ran)]))  # without knowing it was owed: a no-data batch
    assert not is_caught_up(FakeQuery([(DRAINED, owed_ran)]), after_batch=4)
    assert not is_caught_up(FakeQuery([(NO_DATA_RUNNING, owed_ran)]), after_batch=4)
    # a trigger after it asked the sources and planned nothing; or a later batch read nothing new
    assert is_caught_up(FakeQuery([(status("Waiting for data to arrive", False, False), owed_ran)]), after_batch=4)
    assert is_caught_up(FakeQuery([(DRAINED, Progress(5, 3, 3))]), after_batch=4)
    assert not is_caught_up(FakeQuery([(BETWEEN_WITH_DATA, Progress(5, 3, 4))]), after_batch=4)


def test_wait_until_each_query_was_seen_caught_up_once():
    a = FakeQuery([(RUNNING, None), (BETWEEN_WITH_DATA, Progress(0, None, 0)), (DRAINED, Progress(0, None, 0)),
                   (RUNNING, Progress(0, None, 0))])  # a later batch (new input) is not waited for
    b = FakeQuery([(RUNNING, None)] * 4 + [(DRAINED, Progress(0, None, 0))])
    assert wait_until_caught_up([("a", a), ("b", b)], poll_s=0)
    assert not wait_until_caught_up([("c", FakeQuery([(RUNNING, None)]))], poll_s=0.01, timeout_s=0.05)


def test_a_failed_query_raises_with_spark_s_first_line():
    broken = FakeQuery([(RUNNING, None)], error=RuntimeError("[STATE_STORE] could not commit\n\tat x.y"))
    with pytest.raises(JobFailedError, match=r"^the dead-letter query stopped with an error: \[STATE_STORE\] could not commit$"):
        wait_until_caught_up([("dead-letter query", broken)], poll_s=0)


def test_stop_waits_for_the_running_batch():
    q = FakeQuery([(RUNNING, Progress(4, 3, 4))] * 3 + [(DRAINED, Progress(4, 3, 4))])
    stop_after_current_batch(q)
    assert q.stopped and q.i == 3  # it looked until the trigger was over, then stopped


class Batches:
    """A query whose batches end one per look at its last progress, up to ``last``."""

    def __init__(self, first: int, last: int) -> None:
        self.batch, self.last = first, last
        self.stopped = False
        self.status = DRAINED

    @property
    def isActive(self) -> bool:
        return not self.stopped

    @property
    def lastProgress(self):
        self.batch = min(self.batch + 1, self.last)
        return Progress(self.batch, self.batch, self.batch)

    def stop(self) -> None:
        self.stopped = True


def test_stop_lets_the_owed_no_data_batch_run_first():
    q = Batches(first=3, last=9)
    stop_after_current_batch(q, owed=lambda: 6)
    assert q.stopped and q.batch == 6  # batch 6 ended, then the query stopped (not later batches)
    q = Batches(first=3, last=9)
    stop_after_current_batch(q, owed=lambda: None)
    assert q.stopped and q.batch == 3  # nothing owed: stopped at once


def test_a_second_ctrl_c_stops_at_once():
    def interrupted():
        raise KeyboardInterrupt

    q = Batches(first=3, last=9)
    stop_after_current_batch(q, owed=interrupted)
    assert q.stopped and q.batch == 3


def test_an_owed_batch_that_does_not_come_is_waited_for_within_wait_s():
    q = Batches(first=3, last=3)  # Spark never starts batch 4
    stop_after_current_batch(q, wait_s=0.2, owed=lambda: 4)
    assert q.stopped


def test_a_failed_call_into_spark_while_waiting_is_one_line(spark):
    """A call into the JVM that reads a query's status fails (here py4j asks the JVM for a Java object it
    does not hold, as after a broken py4j exchange): the wait raises a one-line JobFailedError, not
    py4j's error."""
    from py4j.java_gateway import JavaObject
    from pyspark.sql.streaming import StreamingQuery

    unknown = StreamingQuery(JavaObject("o999999999", spark.sparkContext._gateway._gateway_client))
    with pytest.raises(JobFailedError) as raised:
        wait_until_caught_up([("query", unknown)], poll_s=0.05, timeout_s=60)
    text = str(raised.value)
    assert text.startswith("the query's status could not be read from Spark (") and "\n" not in text, text
    assert type(raised.value.__cause__).__module__.startswith("py4j.")
