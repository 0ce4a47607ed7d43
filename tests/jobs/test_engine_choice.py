"""The engine is decided once (``sparkstate.compile.choose_engine``): a job's checkpoint goes on with
the engine that wrote it, and a DDL input column with a comma in its type reaches a job intact."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F

import sparkstate as ss
from sparkstate.cli import main
from sparkstate.compile import choose_engine
from sparkstate.jobs import JOB_PIPELINES, JobConfig, JobPipeline, run_pipeline

T = "2024-01-01T12:{}Z".format


def _land(directory: Path, name: str, records: list[dict]) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def _sessionize(land: Path, ck: Path, out: Path, tmp: Path, *extra: str) -> list[str]:
    return ["run", "sessionize", "--source", f"files:{land}", "--sink", f"parquet:{out}",
            "--deadletter", f"json:{tmp / 'dead'}", "--checkpoint", str(ck), "--once", "--no-progress", *extra]


def test_a_tws_checkpoint_goes_on_without_engine_and_refuses_another_one(spark, tmp_path, capsys):
    land, ck = tmp_path / "in", tmp_path / "ck"
    _land(land, "a.json", [{"user_id": "u1", "event_time": T("00:00"), "data": "/home", "is_last": False},
                           {"user_id": "u2", "event_time": T("00:05"), "data": "/help", "is_last": False}])
    out = tmp_path / "sessions"
    assert main(_sessionize(land, ck, out, tmp_path, "--engine", "tws")) == 0, capsys.readouterr().err
    assert ss.state.engine_of(spark, str(ck)) == "tws"

    # u1's open session ends at its flagged event; u3's event moves the watermark past u2's
    _land(land, "b.json", [{"user_id": "u3", "event_time": T("10:00"), "data": "/x", "is_last": False},
                           {"user_id": "u1", "event_time": T("00:30"), "data": "/pay", "is_last": True}])
    assert main(_sessionize(land, ck, out, tmp_path)) == 0, capsys.readouterr().err
    assert ss.state.engine_of(spark, str(ck)) == "tws"
    got = sorted((r.user_id, r.session_start.strftime("%H:%M:%S"), r.session_end.strftime("%H:%M:%S"), r.events,
                  r.closed_by) for r in spark.read.parquet(str(out)).collect() if r.closed_by is not None)
    assert got == [("u1", "12:00:00", "12:00:30", ["/home", "/pay"], "last_event"),
                   ("u2", "12:00:05", "12:00:05", ["/help"], "timeout")]

    # naming another engine on it is refused before anything runs, with the way out
    _land(land, "c.json", [{"user_id": "u4", "event_time": T("20:00"), "data": "/y", "is_last": True}])
    assert main(_sessionize(land, ck, out, tmp_path, "--engine", "batched")) != 0
    err = capsys.readouterr().err
    assert "tws" in err and "Traceback" not in err, err
    assert "u4" not in {r.user_id for r in spark.read.parquet(str(out)).collect()}

    # A job reading Kafka does not pack sessionize's input by default; on this checkpoint that default goes
    # on with the tws engine, not with the batched engine its no-packing would need (that is refused above).
    events = spark.readStream.schema(JOB_PIPELINES["sessionize"].schema).json(str(land))
    kafka = JobConfig("sessionize", source="kafka:localhost:9092/clicks", checkpoint=str(ck))
    assert kafka.pack is False
    JOB_PIPELINES["sessionize"].build(events, kafka, spark).explain()
    assert "TransformWithState" in capsys.readouterr().out


def test_the_engine_is_chosen_in_one_place():
    assert choose_engine(None).name == "batched"
    assert choose_engine(None, "tws").name == "tws"
    assert choose_engine(None, "batched", state_ttl=True).name == "batched"  # the stored state decides
    assert choose_engine("tws", "batched").name == "tws"  # named: the checkpoint check refuses the mismatch
    assert choose_engine(None, state_ttl=True).name == "tws"
    assert type(choose_engine(ss.BatchedEngine(buckets=3), vectorized=True)).__name__ == "VectorizedEngine"
    with pytest.raises(ss.ConfigError, match="batched engine's layout only"):
        choose_engine("tws", vectorized=True)


def _totals(events, cfg, spark):
    def add(user, rows, state):
        total = (state.getOption or Decimal("0")) + sum(r.amount for r in rows)
        state.update(total)
        return (user, total)

    return ss.map_groups_with_state(events.select("user_id", "amount"), key="user_id", func=add, state_type=Decimal,
                                    output_type="user_id string, total decimal(12,2)", checkpoint=cfg.checkpoint)


def test_a_decimal_input_column_reaches_a_job_intact(spark, tmp_path, monkeypatch):
    pipeline = JobPipeline("totals", "user_id string, amount decimal(10,2), note string", "update", _totals)
    assert pipeline.columns == ["user_id", "amount", "note"]
    monkeypatch.setitem(JOB_PIPELINES, "totals", pipeline)
    land = tmp_path / "in"
    _land(land, "a.json", [{"user_id": "a", "amount": 12.50, "note": "x,y"}, {"user_id": "a", "amount": 0.25, "note": ""},
                           {"user_id": "b", "amount": 99999999.99, "note": "max"}])
    result = run_pipeline(spark, JobConfig("totals", source=f"files:{land}", sink="memory:ec_totals",
                                           deadletter=f"json:{tmp_path / 'dead'}", checkpoint=str(tmp_path / "ck"),
                                           once=True))
    assert result.dead_letters == 0
    rows = spark.table("ec_totals").groupBy("user_id").agg(F.max("total").alias("total")).collect()
    assert sorted((r.user_id, r.total) for r in rows) == [("a", Decimal("12.75")), ("b", Decimal("99999999.99"))]


def test_no_pack_leaves_out_the_packing_step_and_a_checkpoint_takes_either(spark, tmp_path, capsys):
    import random

    from sparkstate.synthetic import Session, generate_events, reference_sessions
    from sparkstate.synthetic.generator import EVENT_SCHEMA

    # The plan: packed, a Python stage (mapInArrow) cuts the input into blobs before the shuffle; --no-pack has none.
    (tmp_path / "nothing").mkdir()
    events = spark.readStream.schema(EVENT_SCHEMA).json(str(tmp_path / "nothing"))
    plans = {}
    for pack in (True, False):
        JOB_PIPELINES["sessionize"].build(events, JobConfig("sessionize", source="files:x", pack=pack), spark).explain()
        plans[pack] = capsys.readouterr().out
    assert "MapInArrow" in plans[True] and "MapInArrow" not in plans[False] and "TransformWithState" in plans[False]
    # Not given: sessionize packs what a files: source reads (large batches), not what kafka: streams.
    for source, packed in (("files:x", True), ("kafka:localhost:9092/clicks", False)):
        JOB_PIPELINES["sessionize"].build(events, JobConfig("sessionize", source=source), spark).explain()
        assert ("MapInArrow" in capsys.readouterr().out) is packed, source
    JOB_PIPELINES["running-count"].build(
        spark.readStream.schema("word string").json(str(tmp_path / "nothing")),
        JobConfig("running-count", source="kafka:localhost:9092/words"), spark).explain()
    assert "MapInArrow" in capsys.readouterr().out  # the count packs: it sustains more so

    # One checkpoint run packed, then without packing, then packed again: packing does not change the state's
    # layout, so the sessions are the reference's. Each third of the events lands shuffled.
    all_events = generate_events(240, users=6, seed=31)
    land, out, ck, metrics = tmp_path / "in", tmp_path / "sessions", tmp_path / "ck", tmp_path / "metrics.jsonl"
    land.mkdir()
    rng = random.Random(5)
    for i, flags in enumerate(([], ["--no-pack"], [])):
        part = all_events[i * 80:(i + 1) * 80]
        rng.shuffle(part)
        (land / f"part-{i}.json").write_text("".join(e.to_json() + "\n" for e in part))
        code = main(_sessionize(land, ck, out, tmp_path, "--watermark", "0 seconds", "--metrics", str(metrics), *flags))
        assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    last = lines[-1]
    written = sorted((Session.from_row(r) for r in spark.read.parquet(str(out)).collect()),
                     key=lambda s: (s.user_id, s.session_start))
    from datetime import datetime, timezone
    final = datetime.strptime(last["watermark"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert written == reference_sessions(all_events, "1 minute", watermark=final)
    assert len(written) > 10 and sum(m["dead_letters"] for m in lines) == 0


def test_no_pack_is_refused_beside_an_engine_that_always_packs(tmp_path, capsys):
    land = tmp_path / "in"
    _land(land, "a.json", [{"user_id": "u1", "event_time": T("00:00"), "data": "/home", "is_last": True}])
    args = _sessionize(land, tmp_path / "ck", tmp_path / "out", tmp_path, "--no-pack", "--engine", "tws")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--no-pack applies to the batched engine" in err and "tws" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "ck").exists()


def test_no_pack_alone_is_refused_only_where_the_default_engine_always_packs():
    from sparkstate.engines import default_engine

    if default_engine() == "batched":
        assert JobConfig("sessionize", source="files:x", pack=False).pack is False
    else:  # PySpark 3.5 (the version matrix runs this there): the inband engine, before Spark starts
        with pytest.raises(ss.ConfigError, match=r"batched engine needs PySpark 4\.0\+; this PySpark runs the inband"
                                                 r" engine, which always packs \(drop --no-pack\)"):
            JobConfig("sessionize", source="files:x", pack=False)
