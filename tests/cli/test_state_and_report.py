"""`sparkstate state show|stats|export` and `sparkstate report` on the checkpoint and metrics of a real run."""

from __future__ import annotations

import json
import statistics

from sparkstate.cli import main
from sparkstate.synthetic import generate_events, read_events, reference_sessions, write_events

GAP = "1 minute"


def test_state_show_stats_export_and_report_after_a_sessionize_run(spark, tmp_path, capsys):
    files = write_events(generate_events(240, users=5, seed=9), tmp_path / "in", files=3)
    events = read_events(files)
    ck, metrics = tmp_path / "ck", tmp_path / "metrics.jsonl"
    assert main([
        "run", "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
        "--sink", f"parquet:{tmp_path / 'out'}", "--checkpoint", str(ck), "--gap", GAP,
        "--time-mode", "event", "--watermark", "0 seconds", "--once", "--metrics", str(metrics), "--no-progress",
    ]) == 0
    capsys.readouterr()

    # The open sessions a person expects: the sessions the reference has that are not finished
    # by the final watermark (the last event's time, delay 0). A key shows the events of its
    # open sessions one after another, `sizes` saying how many each session has.
    watermark = max(e.event_time for e in events)
    finished = set(reference_sessions(events, GAP, watermark=watermark))
    expected_open = {(s.user_id, s.event_count, s.events) for s in reference_sessions(events, GAP)
                     if s not in finished}
    assert expected_open

    assert main(["state", "show", str(ck), "--json", "--limit", "0"]) == 0
    shown = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sessions = []
    for r in shown:
        assert len(r["times"]) == len(r["events"]) == sum(r["sizes"]) and len(r["closed"]) == len(r["sizes"])
        pos = 0
        for size in r["sizes"]:
            sessions.append((r["user_id"], size, tuple(r["events"][pos:pos + size])))
            pos += size
    assert set(sessions) == expected_open and len(sessions) == len(expected_open)
    assert all(r["timeout_ms"] is not None for r in shown)
    expected_keys = {user for user, _, _ in expected_open}

    one = shown[0]["user_id"]
    assert main(["state", "show", str(ck), "--key", one]) == 0
    table = capsys.readouterr().out
    assert one in table and "timeout_ms" in table and "UTC" in table

    assert main(["state", "stats", str(ck)]) == 0
    stats = capsys.readouterr().out
    assert f"keys: {len(expected_keys)} ({len(expected_keys)} with a pending timeout)" in stats
    assert "time mode EventTime" in stats and "partition 0:" in stats
    assert "layout: batched engine, version 2, 2 state partitions, buckets 8" in stats  # 2 partitions: 8
    # five users hold a leaf or two per bucket: too few for a scan to pay, every read is by key
    assert " buckets, " in stats and "every bucket has fewer than 8 leaves and is read leaf by leaf" in stats

    assert main(["state", "export", str(ck), str(tmp_path / "state.parquet")]) == 0
    assert f"exported the state of {len(expected_keys)} keys" in capsys.readouterr().out
    assert spark.read.parquet(str(tmp_path / "state.parquet")).count() == len(expected_keys)

    assert main(["report", str(metrics), "--out", str(tmp_path / "report")]) == 0
    summary = capsys.readouterr().out
    assert f"rows in: {len(events)}" in summary
    with_data = sum(1 for line in metrics.read_text().splitlines() if json.loads(line)["rows_in"])
    assert f"state reads (batches with data): 0 by scan, {with_data} by key only, 0 read nothing" in summary
    # the p50 of each stage of a batch with data, from the metrics lines themselves
    runs = sorted(m["add_batch_ms"] for m in map(json.loads, metrics.read_text().splitlines()) if m["rows_in"])
    (stage_line,) = [line for line in summary.splitlines() if line.startswith("batch time by stage, p50 ms")]
    assert f"add batch {statistics.median(runs):.0f}," in stage_line and "planning " in stage_line, stage_line
    for name in ("throughput.png", "batch_duration.png", "state_size.png"):
        png = tmp_path / "report" / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_state_show_on_a_foreign_directory_says_why(tmp_path, capsys, spark):
    assert main(["state", "show", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_report_on_a_missing_file(tmp_path, capsys):
    assert main(["report", str(tmp_path / "m.jsonl"), "--out", str(tmp_path)]) == 2
    assert "metrics file" in capsys.readouterr().err
