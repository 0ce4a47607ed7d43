"""``sparkstate run sessionize`` SIGKILLed mid-stream and restarted on the minor's default engine
(3.5: inband; 4.0 and later: batched) writes the generator's reference sessions, and
``sparkstate state show|stats`` read the checkpoint it leaves: the open sessions the reference
has not finished by the final watermark. Small on purpose: besides the main suite, it runs on the
version matrix's minors whose job runs other code (3.5 and 4.0, tests/versions/test_matrix.py),
beside the main suite's kill tests (test_driver_crash.py).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sparkstate.cli import main
from sparkstate.engines import default_engine
from sparkstate.jobs.generate import generate_files
from sparkstate.synthetic import Session, StreamConfig, reference_sessions, stream_records
from tests.reliability.crash import MID_BATCH, Checkpoint, CrashingJob, ParquetProbe, PlannedKill, cli

pytestmark = pytest.mark.reliability

GAP = "1 minute"
FILES = 3
DATA = StreamConfig(users=8, seed=21, events=240, rate=0, malformed_share=0.03)
RUN_TIMEOUT_S = 600.0  # one run: seconds on an idle machine, minutes on a crowded one


@pytest.mark.timeout(1800)
def test_sessionize_killed_and_restarted_equals_the_reference_and_the_state_tools_read_it(spark, tmp_path, capsys):
    written = generate_files(tmp_path / "in", DATA, files=FILES)
    assert len(written.paths) == FILES
    records = stream_records(DATA)
    out, ck = tmp_path / "sessions", tmp_path / "ck"
    args = cli("run", "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
               "--sink", f"parquet:{out}", "--checkpoint", str(ck), "--gap", GAP, "--time-mode", "event",
               "--watermark", "0 seconds", "--trigger", "500 milliseconds", "--option", "maxFilesPerTrigger=1",
               "--once", "--no-progress")
    job = CrashingJob(args, Checkpoint(ck), ParquetProbe(out), tmp_path / "job.log", tmp_path)
    try:
        # SIGKILL while the run's second batch is planned and not written: the restart redoes it
        kill = job.run_and_kill(PlannedKill(MID_BATCH, skip=1), RUN_TIMEOUT_S)
        assert kill is not None, f"the job ended before it was killed; its log ends:\n{job.log.read_text()[-3000:]}"
        assert job.run_to_end(RUN_TIMEOUT_S) == 0, job.log.read_text()[-3000:]
    finally:
        assert job.leftovers() == [], "processes of the job outlived it"

    events = [r.event for r in records if r.is_valid]
    final_ms = job.checkpoint.watermark_ms(job.checkpoint.last_planned())
    assert final_ms == int(max(e.event_time for e in events).timestamp() * 1000)
    expected = Counter(reference_sessions(events, GAP, watermark=final_ms))
    got = Counter(Session.from_row(r) for r in spark.read.parquet(str(out)).collect())
    assert got == expected, f"lost {list((expected - got).elements())[:3]}, extra {list((got - expected).elements())[:3]}"
    assert sum(expected.values()) > 10
    dead = Counter(r.raw for r in spark.read.parquet(str(out / "_deadletter")).collect())
    assert dead == Counter(r.line for r in records if not r.is_valid) and dead

    # What the state holds: the reference's sessions not finished by the final watermark.
    finished = set(expected)
    expected_open = {(s.user_id, s.event_count, s.events) for s in reference_sessions(events, GAP)
                     if s not in finished}
    users = {u for u, _, _ in expected_open}
    assert expected_open
    capsys.readouterr()
    assert main(["state", "show", str(ck), "--json", "--limit", "0"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sessions = set()
    for r in shown:
        pos = 0
        for size in r["sizes"]:
            sessions.add((r["user_id"], size, tuple(r["events"][pos:pos + size])))
            pos += size
    assert sessions == expected_open and len(shown) == len(users)
    assert main(["state", "stats", str(ck)]) == 0
    stats = capsys.readouterr().out
    assert f"keys: {len(users)} ({len(users)} with a pending timeout)" in stats
    assert f"layout: {default_engine()} engine" in stats and "partition 0:" in stats
    print(f"\nkilled at {kill.point} of batch {kill.batch}; runs took {job.seconds} s")
