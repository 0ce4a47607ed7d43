"""A job's file sinks, SIGKILLed while a file is written and while a batch that is then replayed is published.

``sparkstate run sessionize`` (files in, a few malformed records) writes its sessions to
``parquet:DIR`` or ``json:DIR`` and its dead letters to ``DIR/_deadletter`` (same format). The
driver's whole process group is killed twice, at moments read from the disk:

1. **during a file write**: a task file of the output's batch appears in its staging directory
   (``DIR/_sparkstate_tmp``); the batch's dead letters are then written, its output is not;
2. **during a batch that is then replayed**: files of the output's batch N are in place in
   ``DIR`` and ``commits/N`` is not written (Spark runs N again on restart);

then ``--once`` runs to the end. After each kill, and at the end, each directory is read with
Spark, pandas, pyarrow and DuckDB (``tests/io/readers.py``): no reader fails, no reader sees a row
twice, and at the end they all see the same rows: the generator's reference sessions and every
malformed record once.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest

from sparkstate.io.files import STAGING_DIR
from sparkstate.jobs.generate import generate_files
from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from tests.io.readers import READERS, read_everywhere
from tests.reliability.crash import Checkpoint, JobProcess, cli, tagged_processes

pytestmark = pytest.mark.reliability

GAP = "1 minute"
FILES = 4
DATA = StreamConfig(users=15, seed=23, events=400, rate=0, malformed_share=0.05)
RUN_TIMEOUT_S = 300.0  # one run: a JVM start and a few batches, minutes on a crowded machine
SESSION_COLUMNS = ("user_id", "event_count", "closed_by")
DEAD_COLUMNS = ("raw", "reason")


def _staged_part(out: Path) -> bool:
    """A task file of the output is being written (or waits to be moved) in the staging directory."""
    for _, _, names in os.walk(out / STAGING_DIR):
        if any(n.startswith("part-") for n in names):
            return True
    return False


def _published_uncommitted(out: Path, ck: Checkpoint) -> int | None:
    """Batch N whose files are in place in ``out`` while ``commits/N`` is not written, else ``None``."""
    n = ck.last_planned()
    if n is None or ck.committed(n) or not any(out.glob(f"part-{n:010d}-*")):
        return None
    return n


def _run_until(args: list[str], log: Path, cwd: Path, tag: str, condition, what: str):
    """Start the job, SIGKILL its process group when ``condition()`` holds; return what it returned."""
    job = JobProcess(args, log, tag, cwd)
    started = time.monotonic()
    try:
        while True:
            got = condition()
            if got is not None and got is not False:
                job.kill()
                return got
            if not job.running():
                raise AssertionError(f"the job ended ({job.proc.returncode}) before {what}; its log ends:\n{job.tail()}")
            if time.monotonic() - started > RUN_TIMEOUT_S:
                raise AssertionError(f"{what} not reached in {RUN_TIMEOUT_S} s; the job's log ends:\n{job.tail()}")
            time.sleep(0.002)
    finally:
        job.kill()


def _read_all(spark, out: Path, fmt: str) -> dict[str, dict[str, Counter]]:
    return {"output": read_everywhere(spark, out, fmt, SESSION_COLUMNS),
            "dead letters": read_everywhere(spark, out / "_deadletter", fmt, DEAD_COLUMNS)}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_file_sinks_read_the_same_rows_everywhere_after_kills_in_a_write_and_in_a_replayed_batch(
        spark, tmp_path, fmt):
    written = generate_files(tmp_path / "in", DATA, files=FILES)
    assert written.records == DATA.events
    records = stream_records(DATA)
    out, ck = tmp_path / "out", Checkpoint(tmp_path / "ck")
    args = cli("run", "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
               "--sink", f"{fmt}:{out}", "--checkpoint", str(ck.path), "--gap", GAP, "--time-mode", "event",
               "--watermark", "0 seconds", "--trigger", "500 milliseconds", "--option", "maxFilesPerTrigger=1",
               "--once", "--no-progress")
    log, tag = tmp_path / "job.log", f"file-sinks-{fmt}-{time.monotonic_ns()}"

    # 1. Killed while a task of the output writes its file (again, up to twice, when the kill landed
    #    after the batch's files were moved into place: the poll can be late on a crowded machine).
    for _ in range(3):
        _run_until(args, log, tmp_path, tag, lambda: _staged_part(out), "a staged output file")
        n1 = ck.last_planned()
        assert n1 is not None
        if not ck.committed(n1) and not any(out.glob(f"part-{n1:010d}-*")):
            break
    else:
        raise AssertionError("three kills aimed at a file write all landed after it")
    assert _staged_part(out)  # the files cut short stay hidden
    after_write = _read_all(spark, out, fmt)
    for where, by_reader in after_write.items():
        assert all(by_reader[r] == by_reader["spark"] for r in READERS), f"{where}: readers disagree {by_reader}"

    # 2. Killed once files of a batch are in place and before its commit: the restart runs it again.
    for _ in range(3):
        n2 = _run_until(args, log, tmp_path, tag, lambda: _published_uncommitted(out, ck),
                        "a published, uncommitted batch")
        if not ck.committed(n2):
            break
    else:
        raise AssertionError("three kills aimed between a batch's files and its commit all landed after the commit")
    logged = (out / "_spark_metadata" / str(n2)).exists()  # else: killed between the renames and the log entry
    after_publish = _read_all(spark, out, fmt)
    for where, by_reader in after_publish.items():
        listing = [by_reader[r] for r in ("pandas", "pyarrow", "duckdb")]
        assert listing[0] == listing[1] == listing[2], f"{where}: readers disagree {by_reader}"
        assert by_reader["spark"] <= listing[0], f"{where}: Spark sees rows the others do not {by_reader}"

    # 3. To the end.
    job = JobProcess(args, log, tag, tmp_path)
    try:
        assert job.proc.wait(RUN_TIMEOUT_S) == 0, f"the last run failed; its log ends:\n{job.tail()}"
    finally:
        job.kill()
    assert tagged_processes(tag) == []
    assert ck.committed(n2)

    final = _read_all(spark, out, fmt)
    for where, by_reader in final.items():
        assert all(by_reader[r] == by_reader["spark"] for r in READERS), f"{where}: readers disagree {by_reader}"
        for moment, seen in (("the write", after_write), ("the publish", after_publish)):
            for r in READERS:  # a row seen after a kill is not seen twice at the end
                assert seen[where][r] <= by_reader[r], f"{where}, {r}: rows after {moment} not in the end result"

    events = [r.event for r in records if r.is_valid]
    final_ms = ck.watermark_ms(ck.last_planned())
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    sessions = Counter(Session.from_row(r) for r in spark.read.format(fmt).schema(_session_schema(spark, out, fmt))
                       .load(str(out)).collect())
    assert sessions == expected, f"lost {sum((expected - sessions).values())}, extra {sum((sessions - expected).values())}"
    bad = Counter(r.line for r in records if not r.is_valid)
    assert Counter(raw for raw, _ in final["dead letters"]["spark"].elements()) == bad
    assert sum(bad.values()) > 5 and sum(expected.values()) > 50
    assert not [p for p in out.glob("part-*") if p.stat().st_size == 0]
    print(f"\nfile sink kills ({fmt}): during the write of batch {n1}, after batch {n2} was published"
          f" ({'and logged' if logged else 'not yet logged'});"
          f" {sum(expected.values())} sessions, {sum(bad.values())} dead letters read alike by {', '.join(READERS)}")


def _session_schema(spark, out: Path, fmt: str):
    """The output's schema as Spark wrote it (JSON infers strings for timestamps otherwise)."""
    if fmt == "parquet":
        return spark.read.parquet(str(out)).schema
    return "user_id string, session_start timestamp, session_end timestamp, event_count long," \
           " events array<string>, closed_by string"
