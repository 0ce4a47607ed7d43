"""Weeks of event time in a minute or two (the CI version of ``python -m benchmarks.months``).

The generator's daily cycle (``cycle=daily``): 30 users at a time, from 10% of them active at
04:00 UTC to all of them at 16:00, and 10 users replaced a day, so 6 days meet 80 users. The
sessionize job reads the whole stream in micro-batches of 2,000 events (each about 12 hours of
event time). Asserted, at every micro-batch: the keys in state are exactly the users whose
session the reference says is open then, never more than the users active since the batch's
watermark, and at most half the users met; and the sink holds exactly the reference's sessions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.months import MonthsConfig, run_months
from sparkstate.synthetic.stream import active_share, stream_records

pytestmark = pytest.mark.reliability

CONFIG = MonthsConfig(days=6, users=30, churn=10, trough=0.1, seed=3, per_batch=2000, sample_every_s=2.0)


def test_weeks_of_a_daily_cycle_keep_only_the_active_users_in_state(spark, tmp_path: Path) -> None:
    result = run_months(spark, CONFIG, tmp_path / "months", work=tmp_path / "work")
    s = result.summary
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    assert result.ok, "\n".join(failed)
    assert {c.name for c in result.checks} == {"expired_state", "output_exact", "follows_active"}

    v = s["verify"]
    # Every batch of the run was read back and checked (Spark keeps the last 100).
    assert s["state_samples"] == s["batches"] - 1 >= 10 and v["state_samples_wrong"] == []
    assert (v["lost"], v["duplicated"], v["unexpected"]) == (0, 0, 0)
    assert v["sessions_output"] == v["sessions_reference"] == s["sessions"] > 3000
    assert s["input_rows"] == s["events"] == v["events_read"]
    # Batch sizes never exceeded the source's limit, although the whole stream was there at once.
    assert 0 < s["rows_in_max"] <= CONFIG.per_batch

    # The history: 6 days of event time, 80 users met; in state, only the active ones (a batch
    # ending early in a round may still hold the previous round's open sessions, and across midnight
    # those of two populations: at most the users active since the watermark's round).
    assert s["days_of_event_time"] > 5.5
    assert s["users_met"] == len({r.event.user_id for r in stream_records(CONFIG.stream, 0, s["events"])}) == 80
    assert s["state_keys_max"] * 2 <= s["users_met"]
    rows = [r for r in s["samples"] if not r.get("final")]
    assert all(r["keys"] <= r["active_bound"] for r in rows)
    # Spark's watermark for a batch is the previous batch's: the state of a batch holds the open
    # sessions of its whole span (about 12 hours here), so the keys follow the users active over
    # a batch's span, not the hour at its watermark; what never happens is a key of an earlier round.
    assert max(r["keys"] for r in rows) <= max(r["active_bound"] for r in rows) < s["users_met"]
    assert active_share(CONFIG.stream, 4 * 3_600_000) == pytest.approx(CONFIG.trough)
