"""Backpressure: a source far ahead of the job is read in bounded batches, and the lag shows.

``sparkstate run`` limits how much a micro-batch reads by default (``max_batch_records`` for the
generator and Kafka, ``max_batch_files`` for files). Here the whole input is there before the
job starts (a backlog), the limits are set low so that the backlog takes several batches, and
asserted: no batch reads more than its limit, the metrics' ``backlog`` of every batch is exactly
what the source held beyond it (down to 0: the job caught up), and the output is exact. And
with the default limit: a generator that starts far ahead (a ``burst``) and then offers a low
rate, so that the job works the burst off at the limit and then keeps up with the rate.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.soak import run_job, verify_state_and_output
from sparkstate.synthetic.generator import write_lines_in_order
from sparkstate.jobs import JobConfig, run_pipeline
from sparkstate.jobs.control import stop_after_current_batch
from sparkstate.observe.progress import ProgressDisplay

pytestmark = pytest.mark.reliability


def _metrics(path: Path) -> list[dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted((r for r in recs if r["query"] == "output"), key=lambda r: r["batch_id"])


def test_a_generator_backlog_is_read_in_bounded_batches_and_the_lag_goes_to_zero(spark, tmp_path: Path) -> None:
    events, limit = 24_000, 5_000
    source = f"generator:rate=0,events={events},users=300,seed=13"
    job = JobConfig("sessionize", source=source, sink=f"parquet:{tmp_path / 'out'}", checkpoint=str(tmp_path / "ck"),
                    metrics=str(tmp_path / "m.jsonl"), once=True, max_batch_records=limit)
    lines: list[str] = []
    display = ProgressDisplay(title="backpressure")  # the log-line form of the live table
    result = run_pipeline(spark, job, on_batch=lambda m, t: (display.update(m, t), lines.append(display.line(t))))
    batches = [m for m in _metrics(tmp_path / "m.jsonl") if m["rows_in"]]
    assert [m["rows_in"] for m in batches] == [5000, 5000, 5000, 5000, 4000]
    read = 0
    for m in batches:  # the backlog is what the source held beyond each batch: exact, then 0
        read += m["rows_in"]
        assert m["backlog"] == events - read
    assert any("19,000 behind" in line for line in lines) and result.input_rows == events
    v = verify_state_and_output(spark, SimpleNamespace(source=source, gap="1 minute", users=300),
                                tmp_path / "ck", tmp_path / "out", [])
    assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0) and v["sessions_output"] > 1000


def test_a_file_backlog_is_read_max_batch_files_at_a_time(spark, tmp_path: Path) -> None:
    words = [json.dumps({"word": f"w{i % 7}"}) for i in range(500)]
    write_lines_in_order(words, tmp_path / "in", 25, "test")  # 25 files of 20 records, already there
    job = JobConfig("running-count", source=f"files:{tmp_path / 'in'}", sink=f"json:{tmp_path / 'out'}",
                    checkpoint=str(tmp_path / "ck"), metrics=str(tmp_path / "m.jsonl"), once=True,
                    max_batch_files=10)
    result = run_pipeline(spark, job)
    batches = [m for m in _metrics(tmp_path / "m.jsonl") if m["rows_in"]]
    assert [m["rows_in"] for m in batches] == [200, 200, 100] and result.input_rows == 500
    assert {m["backlog"] for m in batches} == {None}  # a file source does not report what is left
    counts: Counter = Counter()
    for f in (tmp_path / "out").glob("**/*.json"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            counts[rec["word"]] = max(counts[rec["word"]], rec["count"])
    assert counts == Counter(json.loads(w)["word"] for w in words)


@pytest.mark.timeout(1200)  # a batch of 100,000 events took 250 s at a load of 20 on 2 cores
def test_a_source_far_ahead_is_read_at_the_default_limit_and_the_job_catches_up_when_the_rate_drops(
        spark, tmp_path: Path) -> None:
    # 120,000 records there at the start (the source far ahead of the job), then 100 a second.
    burst, rate, limit = 120_000, 100, JobConfig("sessionize", source="generator").max_batch_records
    assert limit == 100_000  # sparkstate run's default, not set below
    source = f"generator:rate={rate},burst={burst},users=2000,seed=17"
    name = "backpressure_burst"
    job = JobConfig("sessionize", source=source, sink=f"parquet:{tmp_path / 'out'}", checkpoint=str(tmp_path / "ck"),
                    metrics=str(tmp_path / "m.jsonl"), query_name=name)
    display = ProgressDisplay(title="backpressure")
    seen: list = []
    lines: list[str] = []
    caught_up = threading.Event()

    def on_batch(m, totals) -> None:
        if m.query != "output":
            return
        display.update(m, totals)
        lines.append(display.line(totals))
        seen.append(m)
        # Caught up: three batches in a row, after the burst, less than a second's records behind.
        tail = [b for b in seen if b.rows_in][-3:]
        if totals.rows_in > burst and len(tail) == 3 and all(b.backlog is not None and b.backlog < rate for b in tail):
            caught_up.set()

    def stopper() -> None:
        if caught_up.wait(600):
            for q in [q for q in spark.streams.active if q.name == name]:
                stop_after_current_batch(q)

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        # (run_job: run_pipeline, started again if the generator's Python process did not connect
        # back to Spark within PySpark's fixed 10 s, which happens at a load of 20 on 2 cores)
        result = run_job(spark, job, on_batch, lambda line: print(line))
    finally:
        caught_up.set()
        thread.join(60)
    batches = [m for m in _metrics(tmp_path / "m.jsonl") if m["rows_in"]]
    sizes, backlogs = [m["rows_in"] for m in batches], [m["backlog"] for m in batches]
    print(f"\nburst {burst:,} at {rate}/s, default limit {limit:,}: batches {sizes}, backlog after each {backlogs}")
    # The burst is worked off at the limit: the first batch reads exactly the limit, none more,
    # and the backlog after it is the rest of the burst (plus what the rate added meanwhile).
    assert sizes[0] == limit and max(sizes) <= limit
    assert backlogs[0] >= burst - limit and any(f"{backlogs[0]:,} behind" in line for line in lines)
    # The lag goes down batch by batch to (near) 0, and stays there: the job keeps up with the
    # rate, reading small batches of what arrived since the one before.
    behind = backlogs.index(next(b for b in backlogs if b < rate))
    assert behind >= 1 and all(a >= b for a, b in zip(backlogs[:behind], backlogs[1:behind + 1]))
    assert all(b < rate for b in backlogs[behind:]) and len(backlogs) - behind >= 3
    for before, after in zip(batches[behind:], batches[behind + 1:]):  # what arrived while the one before ran
        assert after["rows_in"] <= rate * (before["batch_duration_ms"] / 1000 + 5) < limit
    assert sum(sizes) == result.input_rows > burst
    v = verify_state_and_output(spark, SimpleNamespace(source=source, gap="1 minute", users=2000),
                                tmp_path / "ck", tmp_path / "out", [])
    assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0) and v["sessions_output"] > 10_000
    print(f"caught up after {behind + 1} batches; {v['sessions_output']:,} sessions, lost 0, duplicated 0")
