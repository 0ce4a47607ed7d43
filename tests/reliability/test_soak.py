"""A short soak run (the CI version of ``make soak``): sessionize on the generator at a fixed rate.

The same code as ``python -m benchmarks.soak`` (:func:`benchmarks.soak.run_soak`), for about
two minutes on the suite's ``local[2]`` session: the event-time sessionization job reads the
seeded generator at a fixed rate, so every few seconds of wall-clock time a round of sessions
begins and ends and their state expires. Asserted: keys in state do not grow (last third against
the middle third, and the slope over the second half; fewer is no fault: what is left is
checked exactly), RocksDB memory stays under the bound
``ss.spark_session()`` sets (64 MB per JVM; a two-minute run does not fill it, so it is judged
on the bound: see benchmarks/soak.py), the state left in the checkpoint is exactly the
reference's open sessions (expired ones are gone), and the sink holds exactly the reference's
closed sessions. Batch duration and keeping up with the rate are measured and reported but not
judged here: on a shared CI machine they follow the machine's load, not the job (``make soak``
judges them, on a quiet machine).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.soak import SoakConfig, Tolerances, run_soak

pytestmark = pytest.mark.reliability

#: 300 users at 300 events/s: a generator round (8 events per user) every 8 s of wall-clock
#: time, so about 9 rounds of sessions open and expire in the run.
#: The run goes on past 2 minutes until 36 batches are done (a loaded machine), at most 4 minutes.
#: Its first half minute is a warm-up the thirds must leave behind: until the first watermark no
#: session is final, so every user starts in state (event-time sessionize emits a session only
#: when no event within the watermark can change it).
CONFIG = SoakConfig(minutes=2.0, rate=300, users=300, seed=11, min_batches=36, max_minutes=4.0,
                    sample_every_s=2.0, state_every_s=5.0)
#: A two-minute run has few batches per third: keys in state swing within a round, so the
#: state's tolerance is wider than the 10-minute run's, and growth fails it only when both
#: measures show it (on a loaded machine one of them alone moved by 31%: a leak moves both, and
#: what is left in state is checked exactly below).
TOLERANCES = Tolerances(state=0.25, duration=0.75, rate=0.2, state_both_ways=False, state_growth_on_both=True)
#: The checks that time the job: reported, judged by ``make soak`` (speed lives in benchmarks/).
TIMED = {"batch_duration", "keeps_up"}


def test_short_soak_stays_flat_and_expired_state_goes_away(spark, tmp_path: Path) -> None:
    result = run_soak(spark, CONFIG, tmp_path / "soak", TOLERANCES, work=tmp_path / "work")
    s = result.summary
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok and c.name not in TIMED]
    assert not failed, "\n".join(failed) + f"\nthirds: {json.dumps(s['thirds'])}\nload: {s['load_average']}"
    # state_disk is judged only in runs longer than Spark's retention of 100 batches (make soak).
    assert {c.name for c in result.checks} - {"state_disk"} == {
        "state_keys", "state_rows", "state_memory", "batch_duration", "keeps_up", "expired_state", "output_exact"}
    assert s["state_samples"] >= 6

    v = s["verify"]
    assert v["state_samples_checked"] == s["state_samples"] and v["state_samples_wrong"] == []
    # Sessions really expired, many times over: far more were closed by a timeout than there are keys.
    assert v["sessions_by_closed_by"]["timeout"] > 3 * CONFIG.users
    assert s["sessions_timed_out"] == v["sessions_by_closed_by"]["timeout"]
    # What is left in state is exactly the open sessions, each waiting on a timeout not yet due.
    assert v["state_keys"] == v["state_keys_stats"] == v["state_keys_with_timeout"] == v["open_sessions_reference"]
    assert v["left_over_after_expiry"] == [] and v["missing"] == [] and v["timeout_already_due"] == []
    assert v["state_keys"] <= CONFIG.users
    # Nothing lost or duplicated under load, and every record read was counted.
    assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0)
    assert v["sessions_output"] == v["sessions_reference"] == s["sessions_emitted"] > 0
    assert s["events"] == v["events_read"] and s["dead_letters"] == 0

    assert [p.name for p in result.images] == ["soak_batch_duration.png", "soak_state.png", "soak_resources.png",
                                               "soak_levels.png"]
    # where RocksDB memory, the disk and the processes' memory settle, each with its maximum
    assert set(s["levels"]) == {"rocksdb_memory_mb", "state_disk_mb", "jvm_rss_mb", "python_workers_mb"}
    assert all(lv["max"] is not None and lv["level"] is not None for lv in s["levels"].values())
    for p in result.images:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size < 150_000
    saved = json.loads((tmp_path / "soak" / "soak.json").read_text())
    assert saved["ok"] is True and len(saved["thirds"]) == 3
    assert (tmp_path / "soak" / "report" / "summary.txt").is_file()
