"""Export -> ``sparkstate run PIPELINE --initial-state FILE``, for every job pipeline.

Each test runs the pipeline on a first checkpoint, exports its state with ``sparkstate state
export``, starts a second checkpoint from the export on new input, and checks the exact output.
"""

from __future__ import annotations

import json
from pathlib import Path

from sparkstate.cli import main


def _run(tmp: Path, pipeline: str, name: str, records: list[dict], table: str, *extra: str) -> str:
    land = tmp / f"in-{name}"
    land.mkdir()
    (land / "part.json").write_text("".join(json.dumps(r) + "\n" for r in records))
    ck = tmp / f"ck-{name}"
    args = ["run", pipeline, "--source", f"files:{land}", "--sink", f"memory:{table}",
            "--deadletter", f"json:{tmp / ('dead-' + name)}", "--checkpoint", str(ck), "--once", "--no-progress",
            *extra]
    return ck, args


def _first_then_from_export(spark, tmp, capsys, pipeline, first, second, table):
    ck1, args = _run(tmp, pipeline, "first", first, f"{table}_first")
    assert main(args) == 0, capsys.readouterr().err
    export = tmp / "state.parquet"
    assert main(["state", "export", str(ck1), str(export)]) == 0, capsys.readouterr().err
    assert f"--initial-state {export}" in capsys.readouterr().out
    ck2, args = _run(tmp, pipeline, "second", second, table, "--initial-state", str(export))
    assert main(args) == 0, capsys.readouterr().err
    return spark.table(table).collect()


def test_running_count_continues_from_an_export(spark, tmp_path, capsys):
    rows = _first_then_from_export(
        spark, tmp_path, capsys, "running-count",
        [{"word": w} for w in ["spark", "state", "spark"]],
        [{"word": w} for w in ["spark", "new"]], "ist_count")
    assert sorted((r.word, r["count"]) for r in rows) == [("new", 1), ("spark", 3)]


def test_first_last_activity_continues_from_an_export(spark, tmp_path, capsys):
    rows = _first_then_from_export(
        spark, tmp_path, capsys, "first-last-activity",
        [{"user": "ann", "timestamp": "2024-01-01T12:00:00Z", "activity": "browse"},
         {"user": "ann", "timestamp": "2024-01-01T12:04:00Z", "activity": "browse"},
         {"user": "bob", "timestamp": "2024-01-01T12:01:00Z", "activity": "browse"}],
        # ann: the same activity stretches the exported span; bob: an older other activity is ignored
        [{"user": "ann", "timestamp": "2024-01-01T12:06:00Z", "activity": "browse"},
         {"user": "bob", "timestamp": "2024-01-01T12:00:30Z", "activity": "buy"}], "ist_span")
    got = sorted((r.user, r.activity, r.start.strftime("%H:%M:%S"), r.end.strftime("%H:%M:%S")) for r in rows)
    assert got == [("ann", "browse", "12:00:00", "12:06:00"), ("bob", "browse", "12:01:00", "12:01:00")]


def test_visited_pages_continues_from_an_export(spark, tmp_path, capsys):
    rows = _first_then_from_export(
        spark, tmp_path, capsys, "visited-pages",
        [{"user_id": "a", "page": "page1"}, {"user_id": "a", "page": "page2"}],
        [{"user_id": "a", "page": "page3"}, {"user_id": "b", "page": "page5"}], "ist_pages")
    assert sorted((r.user_id, r.visited_pages) for r in rows) == [("a", ["page1", "page2", "page3"]), ("b", ["page5"])]


def test_sessionize_continues_open_sessions_from_an_export(spark, tmp_path, capsys):
    t = "2024-01-01T12:{}Z".format
    # the event that moves the watermark comes first: the result does not depend on the order
    second = [{"user_id": "u3", "event_time": t("10:00"), "data": "/x", "is_last": False},
              {"user_id": "u1", "event_time": t("00:30"), "data": "/pay", "is_last": True}]
    rows = _first_then_from_export(
        spark, tmp_path, capsys, "sessionize",
        [{"user_id": "u1", "event_time": t("00:00"), "data": "/home", "is_last": False},
         {"user_id": "u1", "event_time": t("00:10"), "data": "/cart", "is_last": False},
         {"user_id": "u2", "event_time": t("00:05"), "data": "/help", "is_last": False}],
        second, "ist_sessions")
    got = sorted((r.user_id, r.session_start.strftime("%H:%M:%S"), r.session_end.strftime("%H:%M:%S"),
                  r.events, r.closed_by) for r in rows if r.user_id is not None and r.closed_by is not None)
    # u1's open session continues into the second checkpoint and ends at its flagged event; u2's
    # times out once u3's event moves the watermark past it; u3's stays open.
    assert got == [("u1", "12:00:00", "12:00:30", ["/home", "/cart", "/pay"], "last_event"),
                   ("u2", "12:00:05", "12:00:05", ["/help"], "timeout")]
