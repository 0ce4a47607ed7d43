"""The sparkstate command line: help, and the demo end to end (its summary against its Parquet output)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparkstate.cli import main
from sparkstate.engines import runtime
from tests.streams import committed_files

SCRIPT = Path(sys.executable).with_name("sparkstate")


def test_help_runs_from_the_installed_script():
    done = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: sparkstate" in done.stdout and "demo" in done.stdout
    done = subprocess.run([str(SCRIPT), "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--events" in done.stdout and "--out" in done.stdout


def test_demo_writes_sessions_and_its_summary_matches_them(spark, tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--events", "400", "--users", "8", "--out", str(out), "--seed", "3"]) == 0
    printed = capsys.readouterr().out

    table = pq.read_table(out / "sessions").to_pylist()  # what the Parquet sink committed
    summary = json.loads((out / "summary.json").read_text())
    assert table and summary["sessions_written"] == len(table)
    assert summary["closed_by"] == dict(Counter(r["closed_by"] for r in table))
    assert summary["users_with_sessions"] == len({r["user_id"] for r in table})
    assert summary["events_in_sessions"] == sum(r["event_count"] for r in table)
    assert all(r["event_count"] == len(r["events"]) for r in table)
    assert summary["input_events"] == 400 == summary["events_in_sessions"] + _open_events(out, summary)
    assert summary["matches_reference"] is True and summary["mismatches"] == []
    assert summary["batches"] == summary["input_files"] + 1  # one per file, then the watermark's

    # The printed table shows the same numbers.
    lines = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in printed.splitlines() if line.count("│") >= 3}
    assert lines["sessions written"] == str(len(table))
    assert lines["still open at the end"] == str(summary["open_sessions"])
    for how, n in summary["closed_by"].items():
        assert lines[f"closed by {how}"] == str(n)
    assert lines["equals the reference"] == "yes"
    assert str(out / "sessions") in printed


def _open_events(out: Path, summary: dict) -> int:
    """Events of the sessions the demo reports as still open (from the generator's reference)."""
    from sparkstate.synthetic import read_events, reference_sessions

    events = read_events(sorted((out / "input").glob("part-*.json")))
    finished = set(reference_sessions(events, summary["gap"], watermark=_ms(summary["final_watermark"])))
    still_open = [s for s in reference_sessions(events, summary["gap"]) if s not in finished]
    assert len(still_open) == summary["open_sessions"]
    return sum(s.event_count for s in still_open)


def _ms(iso: str) -> int:
    from datetime import datetime, timezone

    return int(datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp() * 1000)


def test_demo_refuses_a_directory_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "was not made by `sparkstate demo`" in err and "Traceback" not in err
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_bad_numbers_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--events", "0"])
    assert exc.value.code == 2
    assert "expected a positive whole number, got '0'" in capsys.readouterr().err


# --- sparkstate run ---------------------------------------------------------------------------

GAP = "1 minute"


def _utc(iso: str):
    from datetime import datetime, timezone

    return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def test_run_sessionize_once_writes_exactly_the_reference_sessions(spark, tmp_path, capsys):
    from sparkstate.synthetic import Session, generate_events, read_events, reference_sessions, write_events

    files = write_events(generate_events(300, users=6, seed=22), tmp_path / "in", files=3)
    events = read_events(files)
    (tmp_path / "in" / "part-00003.json").write_text(  # two malformed records: they become dead letters
        '{"user_id": "user-000", "event_time": "2024-01-01T00:00:01.000Z", "data": "/x"\n'
        '{"event_time": "2024-01-01T00:00:02.000Z", "data": "/y", "is_last": false}\n'
    )
    out, metrics = tmp_path / "out", tmp_path / "metrics.jsonl"
    code = main([
        "run", "sessionize", "--source", f"files:{tmp_path / 'in'}", "--format", "json",
        "--sink", f"parquet:{out}", "--checkpoint", str(tmp_path / "ck"), "--gap", GAP,
        "--time-mode", "event", "--watermark", "0 seconds", "--once", "--metrics", str(metrics),
    ])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "caught up (--once)" in printed.out and "Traceback" not in printed.err

    # One metrics line per micro-batch of the job's query, with every field.
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    output = [m for m in lines if m["query"] == "output"]
    assert output == lines
    assert [m["batch_id"] for m in output] == list(range(len(output))) and len(output) >= 2
    assert set(lines[0]) == {
        "time", "query", "query_name", "run_id", "batch_id", "rows_in", "input_rows_per_s",
        "processed_rows_per_s", "batch_duration_ms", "state_rows", "state_rows_updated", "state_rows_removed",
        "state_memory_bytes", "timers_expired", "rows_out", "timed_out", "dead_letters", "dead_letters_total",
        "watermark", "late", "rows_dropped_by_watermark", "backlog", "state_point_reads", "state_bytes_scanned",
        "state_reads", "offsets_ms", "planning_ms", "add_batch_ms", "log_commit_ms",
    }
    assert sum(m["rows_in"] for m in output) == 302
    assert sum(m["dead_letters"] for m in output) == 2 and lines[-1]["dead_letters_total"] == 2
    assert sum(m["late"] for m in output) == 0 and sum(m["rows_dropped_by_watermark"] for m in output) == 0
    assert all(isinstance(m["state_memory_bytes"], int) for m in output)
    if runtime.pyspark_minor() != (4, 0):  # 4.0's transformWithStateInPandas reports its memory as 0
        assert all(m["state_memory_bytes"] > 0 for m in output)

    # The batch's time by stage: every batch ran (addBatch) and was planned; the stages fit in it.
    for m in output:
        assert m["add_batch_ms"] is not None and m["planning_ms"] is not None and m["offsets_ms"] is not None, m
        parts = m["offsets_ms"] + m["planning_ms"] + m["add_batch_ms"] + (m["log_commit_ms"] or 0)
        assert 0 < m["add_batch_ms"] <= parts <= m["batch_duration_ms"], m

    # The sessions written equal the reference finished by the final watermark, exactly.
    per_batch = {
        b: [Session.from_row(r) for r in spark.read.parquet(*paths).collect()] if paths else []
        for b, paths in sorted(committed_files(out).items())
    }
    written = sorted((s for ss in per_batch.values() for s in ss), key=lambda s: (s.user_id, s.session_start))
    final_watermark = _utc(output[-1]["watermark"])
    expected = reference_sessions(events, GAP, watermark=final_watermark)
    assert written == expected
    assert [m["rows_out"] for m in output] == [len(per_batch.get(m["batch_id"], [])) for m in output]
    assert sum(m["timed_out"] for m in output) == sum(s.closed_by == "timeout" for s in written)
    # the first batch reads every file but runs on no watermark yet, so no session is final in it;
    # the batch after it runs on the final watermark and its timers close several sessions of
    # one user, some ended by a last event and some by the gap
    assert not per_batch.get(0)
    assert max(Counter(s.user_id for s in per_batch[1]).values()) >= 2
    assert {s.closed_by for s in per_batch[1]} == {"last_event", "timeout"}
    # what is left in state are the sessions the watermark has not passed yet
    still_open = set(reference_sessions(events, GAP)) - set(expected)
    import sparkstate as ss

    assert ss.state.keys(spark, tmp_path / "ck") == len(still_open) > 0
    assert re.search(rf"keys left in state\s*│\s*{len(still_open)}\s*│", printed.out)

    reasons = sorted(r.reason for r in spark.read.parquet(str(out / "_deadletter")).collect())
    assert reasons == ["missing field user_id", "not valid JSON"]


def test_run_once_ends_a_processing_time_query_that_never_goes_idle(spark, tmp_path, capsys):
    land = tmp_path / "in"
    land.mkdir()
    rows = [("a", "x", False), ("a", "y", True), ("a", "z", False), ("b", "p", False)]
    (land / "part-0.json").write_text("".join(
        json.dumps({"user_id": u, "event_time": "2024-01-01T00:00:00Z", "data": d, "is_last": last}) + "\n"
        for u, d, last in rows
    ))
    code = main([
        "run", "sessionize", "--source", f"files:{land}", "--sink", "memory:pt_sessions",
        "--deadletter", "memory:pt_dead", "--time-mode", "processing", "--gap", "10 minutes",
        "--checkpoint", str(tmp_path / "ck"),
        "--trigger", "500 milliseconds", "--once", "--metrics", str(tmp_path / "m.jsonl"), "--no-progress",
    ])
    assert code == 0, capsys.readouterr().err
    got = [(r.user_id, r.events, r.closed_by) for r in spark.table("pt_sessions").collect()]
    assert got == [("a", ["x", "y"], "last_event")]
    output = [m for m in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines()) if m["query"] == "output"]
    assert output[-1]["rows_in"] == 0
    import sparkstate as ss

    open_now = sorted((r.user_id, list(r.events)) for r in ss.state.read(spark, tmp_path / "ck").collect())
    assert open_now == [("a", ["z"]), ("b", ["p"])]  # still open, waiting on their processing-time timeout


def test_ctrl_c_lets_the_batch_finish_and_exits_cleanly(spark, tmp_path, capsys):
    import os
    import signal
    import threading
    import time

    land = tmp_path / "in"
    land.mkdir()
    (land / "a.json").write_text('{"word": "spark"}\n{"word": "state"}\n{"word": "spark"}\n')
    metrics = tmp_path / "m.jsonl"

    def interrupt_after_first_batch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if metrics.exists() and '"query":"output"' in metrics.read_text():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.1)

    threading.Thread(target=interrupt_after_first_batch, daemon=True).start()
    code = main([
        "run", "running-count", "--source", f"files:{land}", "--sink", f"json:{tmp_path / 'out'}",
        "--checkpoint", str(tmp_path / "ck"), "--metrics", str(metrics),
    ])
    printed = capsys.readouterr()
    assert code == 0 and "stopped on request" in printed.out
    assert "Traceback" not in printed.err and "Exception" not in printed.err
    # update mode on a file sink: one directory per micro-batch (see sparkstate.io.sinks)
    got = sorted((r.word, r["count"]) for r in spark.read.json(str(tmp_path / "out" / "batch_id=0")).collect())
    assert got == [("spark", 2), ("state", 1)]


def test_run_settings_flags_over_env_over_config_file(tmp_path):
    from sparkstate.cli import build_parser, job_config

    cfg_file = tmp_path / "job.yaml"
    cfg_file.write_text(
        "pipeline: sessionize\nsource: files:from-file\nsink: json:from-file\ngap: 3 minutes\n"
        "trigger: 5 seconds\nwatermark: 30 seconds\noptions:\n  maxFilesPerTrigger: 1\n"
    )
    env = {"SPARKSTATE_SINK": "parquet:from-env", "SPARKSTATE_GAP": "2 minutes", "SPARKSTATE_ONCE": "true",
           "SPARKSTATE_CONFIG": str(cfg_file), "SPARKSTATE_CHECKPOINT": "ck"}
    args = build_parser().parse_args(["run", "--gap", "1 minute", "--option", "latestFirst=false"])
    cfg = job_config(args, env)
    assert cfg.pipeline == "sessionize" and cfg.source == "files:" + os.path.abspath("from-file")  # config file
    assert cfg.sink == "parquet:" + os.path.abspath("from-env") and cfg.once is True  # environment over the file
    assert cfg.gap == "1 minute"  # flag over environment
    assert cfg.trigger == "5 seconds" and cfg.watermark == "30 seconds"
    assert cfg.options == {"latestFirst": "false"}  # flags' options replace the file's
    assert cfg.time_mode == "event" and cfg.metrics is None  # defaults

    args = build_parser().parse_args(["run", "running-count", "--no-once", "--config", str(cfg_file)])
    cfg = job_config(args, env)
    assert (cfg.pipeline, cfg.once, cfg.options) == ("running-count", False, {"maxFilesPerTrigger": "1"})


def test_bad_settings_are_refused_before_spark_starts(tmp_path, capsys):
    bad = tmp_path / "job.toml"
    bad.write_text('pipeline = "sessionize"\nsource = "files:in"\nsinks = "console"\n')
    assert main(["run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"config file {bad}: unknown setting 'sinks'; known settings: pipeline, source, format, sink," in err
    assert main(["run", "sessionize", "--source", "nowhere:x"]) == 2
    assert "source 'nowhere:x': expected one of" in capsys.readouterr().err


def test_generate_writes_files_with_the_records_asked_for(tmp_path, capsys):
    assert main(["generate", "--out", str(tmp_path / "g"), "--events", "120", "--users", "4", "--files", "3",
                 "--malformed", "0.1", "--seed", "5"]) == 0
    assert "Wrote 120 records" in capsys.readouterr().out
    files = sorted((tmp_path / "g").glob("part-*.json"))
    assert [f.name for f in files] == ["part-00000.json", "part-00001.json", "part-00002.json"]
    lines = [line for f in files for line in f.read_text().splitlines()]
    assert len(lines) == 120
    assert 0 < sum(not _parses(line) or "user_id" not in json.loads(line) or json.loads(line)["user_id"] is None
                   or "not a time" in line or '"maybe"' in line for line in lines) < 40


def _parses(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_the_readme_commands_run_as_written(spark, tmp_path, monkeypatch, capsys):
    import re
    import shlex

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Running the pipelines", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    commands = [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["sparkstate", "generate"], ["sparkstate", "run"], ["sparkstate", "state"]]
    monkeypatch.chdir(tmp_path)
    for command in commands:
        assert main(command[1:]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "Wrote 2000 records" in printed and "caught up (--once)" in printed and "keys shown" in printed
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["rows_in"] for m in metrics if m["query"] == "output") == 2000
    assert metrics[-1]["dead_letters_total"] > 0 and (tmp_path / "sessions" / "_deadletter").is_dir()
    assert sum(m["rows_out"] for m in metrics if m["query"] == "output") == spark.read.parquet(str(tmp_path / "sessions")).count() > 0


def test_run_visited_pages_from_an_initial_state_file(spark, tmp_path, capsys):
    land = tmp_path / "in"
    land.mkdir()
    (land / "a.json").write_text('{"user_id": "a", "page": "page4"}\n{"user_id": "b", "page": "page5"}\n')
    (tmp_path / "start.json").write_text('{"user_id": "a", "visited_pages": ["page1", "page2"]}\n')
    assert main([
        "run", "visited-pages", "--source", f"files:{land}", "--initial-state", str(tmp_path / "start.json"),
        "--sink", "memory:visits_out", "--deadletter", f"json:{tmp_path / 'dead'}",
        "--checkpoint", str(tmp_path / "ck"), "--once", "--no-progress",
    ]) == 0, capsys.readouterr().err
    got = sorted((r.user_id, r.visited_pages) for r in spark.table("visits_out").collect())
    assert got == [("a", ["page1", "page2", "page4"]), ("b", ["page5"])]
