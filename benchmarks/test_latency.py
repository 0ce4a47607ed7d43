"""The latency benchmark's bookkeeping, without Spark or Kafka: markers, percentiles, and the
contenders a command line runs (variants: a contender with settings changed)."""

import json
from pathlib import Path

import pytest

from benchmarks.latency import (CONTENDERS, Variant, parse_args, parse_variant, partition_of, plan, run_command,
                                summarize, Workload)


def test_a_count_result_names_the_nth_event_of_its_key():
    w = Workload("count", keys=3, seed=1)
    values = [json.loads(w.event("u00001")[0]) for _ in range(3)]
    assert [w.input_marker(v, n) for n, v in enumerate(values, 1)] == [1, 2, 3]
    assert Workload.marker_of("count", {"word": "u00001", "count": 3}) == 3


def test_a_session_result_names_its_flagged_last_event():
    w = Workload("sessions", keys=3, seed=1)
    value, marker = w.event("u00002", last=True)
    event = json.loads(value)
    assert marker == event["data"] == w.input_marker(event, 1)
    unflagged, none = w.event("u00002", last=False)
    assert none is None and w.input_marker(json.loads(unflagged), 2) is None
    session = {"user_id": "u00002", "events": ["e0", event["data"]], "closed_by": "last_event"}
    assert Workload.marker_of("sessions", session) == event["data"]
    assert Workload.marker_of("sessions", {**session, "closed_by": "timeout"}) is None


def test_percentiles_are_nearest_rank():
    s = summarize([float(v) for v in range(1, 101)])
    assert (s["n"], s["p50"], s["p95"], s["p99"], s["max"]) == (100, 50.0, 95.0, 99.0, 100.0)
    assert summarize([])["p50"] is None


def test_a_key_always_goes_to_the_same_partition():
    assert {partition_of("u00007") for _ in range(5)} == {partition_of("u00007")}


def _args(*argv):
    return parse_args(list(argv))


def test_a_variant_names_its_contender_and_the_settings_it_changes():
    v = parse_variant("sparkstate-batched+partitions=1+changelog=off+trigger=100ms", ["count"])
    assert (v.base, v.trigger) == ("sparkstate-batched", "100 milliseconds")
    assert v.conf == {"spark.sql.shuffle.partitions": "1",
                      "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "false"}
    assert parse_variant("java-mgws", ["count"]) == Variant("java-mgws", "java-mgws", {})


@pytest.mark.parametrize("name, says", [
    ("sparkstate-batched+partition=1", "unknown setting 'partition'"),
    ("sparkstate-batched+partitions=0", "partitions: expected a whole number of at least 1"),
    ("sparkstate-batched+partitions", "partitions needs a value"),
    ("sparkstate-batched+changelog=maybe", "changelog: expected on or off"),
    ("sparkstate-batched+trigger=soon", "trigger: expected a duration"),
    ("sparkstate-batched+partitions=1+partitions=2", "partitions is given twice"),
    ("sparkstate-batchd+partitions=1", "'sparkstate-batchd' is not a contender of count"),
    ("java-fmgws+partitions=1", "'java-fmgws' is not a contender of count"),
    ("sparkstate-batched+pack=off", "pack is a flag of sparkstate run"),
    ("java-mgws+checkpoints=hdfs", "checkpoints: expected filesystem or filecontext"),
])
def test_a_wrong_variant_is_refused_in_one_line_before_anything_starts(name, says, capsys):
    with pytest.raises(SystemExit) as exit_:
        _args("--workload", "count", "--variants", name)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in error and name in error


def test_variants_run_after_their_contender_beside_the_others():
    args = _args("--workload", "count", "--contenders", "java", "sparkstate-batched",
                 "sparkstate-batched+partitions=1", "--variants", "java-mgws+trigger=1 second")
    assert [v.name for v in plan(args, "count")] == [
        "java-mgws", "java-mgws+trigger=1 second", "sparkstate-batched", "sparkstate-batched+partitions=1"]
    only = _args("--workload", "all", "--contenders", "sparkstate-batched+partitions=1")
    assert [v.name for v in plan(only, "sessions")] == ["sparkstate-batched+partitions=1"]
    everything = _args("--workload", "count", "--variants", "sparkstate-nopack+maxrecords=100")
    expected = [c for c in CONTENDERS["count"] if c != "pyspark-pandas"]  # raw PySpark here: transformWithState
    expected.insert(expected.index("sparkstate-nopack") + 1, "sparkstate-nopack+maxrecords=100")
    assert [v.name for v in plan(everything, "count")] == expected


def test_run_triggers_are_variants_of_sparkstate_run():
    args = _args("--workload", "count", "--contenders", "sparkstate-run", "--run-triggers", "100 milliseconds,2s")
    assert [(v.name, v.trigger) for v in plan(args, "count")] == [
        ("sparkstate-run", None), ("sparkstate-run+trigger=100 milliseconds", "100 milliseconds"),
        ("sparkstate-run+trigger=2s", "2000 milliseconds")]


def test_sparkstate_run_takes_the_trigger_as_a_flag_and_spark_settings_as_spark_submit_confs(tmp_path):
    v = parse_variant("sparkstate-run+trigger=250ms+partitions=1", ["count"])
    cmd, env = run_command(v, "count", "127.0.0.1:9092", "in", "out", tmp_path, "t", "1 second", None)
    assert cmd[cmd.index("--trigger") + 1] == "250 milliseconds"
    assert env == {"PYSPARK_SUBMIT_ARGS": "--conf spark.sql.shuffle.partitions=1 pyspark-shell"}
    plain = parse_variant("sparkstate-run", ["count"])
    cmd, env = run_command(plain, "count", "127.0.0.1:9092", "in", "out", tmp_path, "t", "1 second", "--x pyspark-shell")
    assert cmd[cmd.index("--trigger") + 1] == "1 second" and env == {}
    cmd, env = run_command(parse_variant("sparkstate-run+changelog=off", ["count"]), "count", "b", "in", "out",
                           tmp_path, "t", None, "--driver-memory 2g pyspark-shell")
    assert "--trigger" not in cmd
    assert env["PYSPARK_SUBMIT_ARGS"] == ("--conf spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing"
                                          ".enabled=false --driver-memory 2g pyspark-shell")


def test_the_floor_takes_30_records_by_default():
    assert _args().floor == 30


def test_a_fetch_wait_variant_is_a_source_option_for_every_contender():
    """``fetchwait`` changes the Kafka source's option: in the library job's task, and as
    ``--option`` on ``sparkstate run``'s command line; it is no Spark setting."""
    v = parse_variant("sparkstate-run+fetchwait=500", ["count"])
    assert v.options == {"kafka.fetch.max.wait.ms": "500"} and v.conf == {}
    cmd, env = run_command(v, "count", "b:1", "in", "out", Path("/w"), "t", None, None)
    assert "kafka.fetch.max.wait.ms=500" in cmd and cmd[cmd.index("kafka.fetch.max.wait.ms=500") - 1] == "--option"
    assert "PYSPARK_SUBMIT_ARGS" not in env
    assert parse_variant("java-mgws+fetchwait=500", ["count"]).options == {"kafka.fetch.max.wait.ms": "500"}


def test_a_plain_run_measures_the_documented_settings_table():
    """`python -m benchmarks.latency` alone is the run docs/performance.md shows: every contender
    and the settings variants of its table; choosing contenders, or --quick, adds none of them."""
    from benchmarks.latency import DOCUMENTED_VARIANTS

    names = [v.name for w in ("count", "sessions") for v in plan(_args(), w)]
    assert set(DOCUMENTED_VARIANTS) <= set(names)
    # on this PySpark (4.1 or later), raw PySpark is transformWithState: applyInPandasWithState only when named
    assert (set(CONTENDERS["count"]) | set(CONTENDERS["sessions"])) - set(names) == {"pyspark-pandas"}
    assert "pyspark-pandas" in [v.name for v in plan(_args("--contenders", "pyspark"), "count")]
    assert [v.name for v in plan(_args("--contenders", "java"), "count")] == ["java-mgws"]
    assert all("+" not in v.name for v in plan(_args("--quick"), "count"))


@pytest.mark.parametrize("minor, count, sessions", [
    ((3, 5), ["java-mgws", "sparkstate-inband", "sparkstate-run", "pyspark-pandas"],
     ["java-fmgws", "sparkstate-batched", "sparkstate-run", "pyspark-pandas"]),
    ((4, 0), ["java-mgws", "sparkstate-batched", "sparkstate-nopack", "sparkstate-inband", "sparkstate-vectorized",
              "sparkstate-run", "pyspark-pandas"],
     ["java-fmgws", "sparkstate-batched", "sparkstate-run", "pyspark-pandas"]),
    ((4, 3), ["java-mgws", "sparkstate-batched", "sparkstate-nopack", "sparkstate-inband", "sparkstate-vectorized",
              "sparkstate-run", "pyspark-tws"],
     ["java-fmgws", "sparkstate-batched", "sparkstate-run", "pyspark-tws"]),
])
def test_a_run_without_contenders_measures_what_the_installed_pyspark_runs(minor, count, sessions):
    """Raw PySpark is transformWithState from 4.1 (its Python Row API) and applyInPandasWithState
    before; the batched engine, forced, needs 4.0; sessionize runs on every minor's default engine."""
    from benchmarks.latency import runs_here

    assert [c for c in CONTENDERS["count"] if runs_here(c, "count", minor, default=True)] == count
    assert [c for c in CONTENDERS["sessions"] if runs_here(c, "sessions", minor, default=True)] == sessions
    # named, raw applyInPandasWithState runs on every minor; the batched engine never on 3.5
    assert runs_here("pyspark-pandas", "count", minor)
    assert runs_here("sparkstate-batched", "count", minor) == (minor >= (4, 0))


def test_a_contender_named_in_full_that_this_pyspark_lacks_is_left_out_and_named(monkeypatch):
    import benchmarks.latency as latency

    monkeypatch.setattr(latency, "pyspark_minor", lambda: (3, 5))
    args = _args("--contenders", "java", "sparkstate-batched", "sparkstate-inband")
    assert [v.name for v in plan(args, "count")] == ["java-mgws", "sparkstate-inband"]
    assert latency.left_out(args, "count") == ["sparkstate-batched"]
    # a prefix that selects it names nothing: `sparkstate` means what this minor runs
    prefix = _args("--contenders", "sparkstate")
    assert "sparkstate-batched" not in [v.name for v in plan(prefix, "count")]
    assert latency.left_out(prefix, "count") == []
    # a plain run: the documented settings variants of the contenders 3.5 runs
    plain = [v.name for v in plan(_args(), "count")]
    assert "sparkstate-run+trigger=1s" in plain and not any(n.startswith("sparkstate-batched") for n in plain)


def test_an_input_counts_in_the_phase_that_sent_it_not_the_one_whose_window_its_time_falls_in():
    from benchmarks.latency import SETTLE_S, Phase, phase_latencies

    floor = Phase("floor", start_ms=1_000, end_ms=2_000, sent=1)
    rate = Phase("1000/s", start_ms=2_000, end_ms=20_000, sent=3, rate=1000)
    settled = 2_000 + SETTLE_S * 1000
    appended = {("a", 2): 1_500, ("b", 2): 2_010, ("c", 2): settled + 5, ("d", 2): settled + 10}
    phase_of = {("a", 2): "floor", ("b", 2): "1000/s", ("c", 2): "1000/s", ("d", 2): "1000/s"}
    outputs = [("a", 2, 1_800), ("b", 2, 2_400), ("c", 2, settled + 305), ("x", 2, 9_999), ("d", 2, settled + 60)]
    got, backlog_end = phase_latencies({"floor": floor, "1000/s": rate}, appended, outputs, phase_of)
    # b was appended 10 ms after the floor ended: it is the rate phase's, inside its settling time
    assert got == {"floor": [300], "1000/s": [300, 50]} and backlog_end is None


def test_sparkstate_run_takes_its_own_flags_and_the_checkpoint_manager_is_named_for_this_pyspark(tmp_path):
    v = parse_variant("sparkstate-run+pack=off+unixsockets=off", ["count"])
    cmd, env = run_command(v, "count", "b", "in", "out", tmp_path, "t", None, None)
    assert "--no-pack" in cmd and "--pack" not in cmd
    assert env == {"PYSPARK_SUBMIT_ARGS": "--conf spark.python.unix.domain.socket.enabled=false pyspark-shell"}
    cls = parse_variant("java-mgws+checkpoints=filesystem", ["count"]).conf["spark.sql.streaming.checkpointFileManagerClass"]
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    sql_jar = next(jars.glob("spark-sql_*.jar"))
    import zipfile

    assert cls.replace(".", "/") + ".class" in zipfile.ZipFile(sql_jar).namelist()
