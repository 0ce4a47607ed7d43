"""Backpressure: a source far ahead of the job is read in bounded batches, and the lag shows.

``sparkstate run`` limits how much a micro-batch reads by default (``max_batch_records`` for the
generator and Kafka, ``max_batch_files`` for files). Here the whole input is there before the
job starts (a backlog), the limits are set low so that the backlog takes several batches, and
asserted: no batch reads more than its limit, the metrics' ``backlog`` of every batch is exactly
what the source held beyond it (down to 0: the job caught up), and the output is exact.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.soak import verify_state_and_output
from sparkstate.synthetic.generator import write_lines_in_order
from sparkstate.jobs import JobConfig, run_pipeline
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
